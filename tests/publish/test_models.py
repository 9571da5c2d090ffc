"""Every model of the shipped catalogue publishes and searches at its own length. The index is
decided before anything is loaded: HNSW of the vectors up to 2,000 dimensions, of them as
halfvec up to 4,000, of their first 4,000 as halfvec above (vendorB3-embedding-8b's 4,096),
whose candidates a search re-ranks by the whole vector. Each search goes through the index
and finds what exact search finds; above 4,000 dimensions its recall against exact search is
measured on a larger corpus."""
from __future__ import annotations

import json

import psycopg
from psycopg import sql

from pipeline.cli import main
from pipeline.publish import search as found
from pipeline.publish.index import Index
from pipeline.publish.names import Names
from pipeline.settings.config import PublishSettings, SearchSettings
from service.catalog import load_models
from tests.e2e.money_helpers import REPO, corpus_rows, start_sandbox, write_corpus
from tests.publish.helpers import assert_same, published
from tests.publish.test_search import exact_nearest

CATALOGUE = REPO / "configs" / "models.yaml"
LONGEST = "vendorB3-embedding-8b"


def distinct(rows: list[dict]) -> list[dict]:
    """ROWS without the document that shares another's text (equal vectors tie in any order)."""
    return [r for r in rows if r["id"] != "shared"]


def run(corpus, out, sandbox, model: str) -> int:
    return main(["run", "--input", str(corpus), "--output", str(out), "--model", model, "--base-url",
                 sandbox.base_url, "--models-config", str(CATALOGUE)])


def search(capsys, out, url: str, table: str, *args: str) -> dict:
    capsys.readouterr()
    assert main(["search", str(out), *args, "--to", url, "--table", table, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def plan(url: str, table: str, dimensions: int) -> str:
    """The plan of the statement `search --like s-3` runs, the planner kept from a scan."""
    names = Names("public", table)
    like = sql.SQL("SELECT embedding FROM {} WHERE doc_id = 's-3' ORDER BY chunk_index, token_start LIMIT 1").format(
        names())
    statement, params = found.statement(names, Index(dimensions), [], found.Query(5, like, None), PublishSettings(),
                                        SearchSettings())
    with psycopg.connect(url) as conn:
        conn.execute("SET enable_seqscan = off")   # a dozen rows: a scan would be cheaper
        return "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN {}").format(statement), params))


def test_every_model_of_the_catalogue_publishes_and_searches(tmp_path, sandbox_factory, env_key, pg_url, capsys):
    sandbox = start_sandbox(sandbox_factory, CATALOGUE)
    corpus = write_corpus(tmp_path / "corpus.parquet", distinct(corpus_rows(n_short=12, n_long=0)))
    for model, spec in load_models().items():
        out, table = tmp_path / model, model.replace("-", "_").lower()
        assert run(corpus, out, sandbox, model) == 0, model
        report = published(capsys, out, pg_url, "--table", table)
        assert report["dimensions"] == spec.dimensions and f"{spec.dimensions:,} dimensions" in report["index"]
        assert_same(out, pg_url, table)
        assert "_hnsw on embedpipe_data_" in plan(pg_url, table, spec.dimensions), model
        like = search(capsys, out, pg_url, table, "--like", "s-3", "-k", "5")
        assert [(r["doc_id"], r["chunk_index"]) for r in like["results"]] == exact_nearest(out, "s-3", 5), model
        found = search(capsys, out, pg_url, table, "budget vector rouble", "-k", "3", "--base-url",
                       sandbox.base_url, "--models-config", str(CATALOGUE))
        assert len(found["results"]) == 3 and found["model"] == model
    with psycopg.connect(pg_url) as conn:
        indexes = dict(conn.execute("SELECT tablename, indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'"))
    longest = next(d for t, d in indexes.items() if t.startswith("embedpipe_data_") and "subvector" in d)
    assert "halfvec(4000)" in longest and len([d for d in indexes.values() if "subvector" in d]) == 1


def test_above_4000_dimensions_search_recalls_what_exact_search_finds(tmp_path, sandbox_factory, env_key, pg_url,
                                                                     capsys):
    """Recall@10 of `search --like` against exact cosine over the whole vectors, on 300
    documents of vendorB3-embedding-8b (the figure is printed)."""
    sandbox = start_sandbox(sandbox_factory, CATALOGUE)
    corpus = write_corpus(tmp_path / "corpus.parquet", distinct(corpus_rows(n_short=300, n_long=0, seed=11)))
    out = tmp_path / "out"
    assert run(corpus, out, sandbox, LONGEST) == 0
    assert published(capsys, out, pg_url)["dimensions"] == 4096
    hits = total = 0
    for n in range(0, 300, 10):
        doc = f"s-{n}"
        got = search(capsys, out, pg_url, "embeddings", "--like", doc, "-k", "10")["results"]
        want = exact_nearest(out, doc, 10)
        hits += len({(r["doc_id"], r["chunk_index"]) for r in got} & set(want))
        total += len(want)
    recall = hits / total
    print(f"recall@10 of search above 4,000 dimensions ({LONGEST}, 300 documents): {recall:.3f}")
    assert recall >= 0.95

"""LangChain's PGVectorStore (langchain-postgres, in .venv-interop) opened on a published table as
docs/postgres.md shows it: its vector search and its hybrid search return the chunks `search`
returns, in the same order, and the documented SQL statement's; the passage is each document's
page_content, chunk_id its id, the kept columns its metadata. `make interop` runs it.

Each query is one word, and each passage holds it a different number of times: every matching
row's ts_rank_cd differs, so the text leg's order is one (LangChain breaks its ties as the server
returns them, search by chunk_id)."""
from __future__ import annotations

import json
import random
import subprocess
import types
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN
from tests.e2e.money_helpers import DIMS, run, start_sandbox, write_models
from tests.interop.interop_venv import INTEROP
from tests.publish.helpers import publish, view_rows
from tests.publish.searching import KEPT, LEG_ROWS, RRF_K, doc_ranking, passages, query_vector, search_json, \
    write_passages

pytestmark = pytest.mark.interop

SCRIPT = Path(__file__).with_name("langchain_search.py")
QUERIES = ("budget", "ledger")


def counted(n: int = 60, seed: int = 7) -> list[dict]:
    """passages()'s rows and kept columns, the texts remade: passage i holds `budget` i + 1 times
    and `ledger` a permuted number of times, among other words."""
    rng = random.Random(seed)
    other = [w for w in WORDS_EN if w not in QUERIES]
    rows = passages(n)[:n]
    for i, row in enumerate(rows):
        words = ["budget"] * (i + 1) + ["ledger"] * ((i * 7) % n + 1) + [rng.choice(other) for _ in range(8)]
        rng.shuffle(words)
        row["text"] = " ".join(words) + "."
    return rows


def test_langchain_reads_the_published_table_as_search_does(tmp_path, sandbox_factory, pg_url, monkeypatch, capsys):
    python = INTEROP.ensure()
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    corpus = write_passages(tmp_path / "passages.parquet", counted())
    assert run(corpus, out, sandbox, models, "--keep-columns", ",".join(KEPT)) == 0
    assert publish(out, pg_url) == 0
    request = {"url": pg_url.replace("postgresql://", "postgresql+psycopg://", 1), "table": "embeddings",
               "kept": list(KEPT), "config": "simple", "rrf_k": RRF_K, "leg_rows": LEG_ROWS, "k": 10,
               "queries": [{"words": w, "vector": json.loads(query_vector(w, DIMS))} for w in QUERIES]}
    (tmp_path / "request.json").write_text(json.dumps(request))
    done = subprocess.run([str(python), str(SCRIPT), str(tmp_path / "request.json")], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout)
    days = types.SimpleNamespace(out=out, base_url=sandbox.base_url, models=models)
    view = {f"{r['doc_id']}:{r['chunk_index']}:{r['token_start']}": r for r in view_rows(out).values()}
    for words in QUERIES:
        hybrid = search_json(capsys, days, pg_url, words)
        vector = search_json(capsys, days, pg_url, words, "--mode", "vector")
        assert len({r["text_rank"] for r in hybrid["results"]} - {None}) > 1   # both legs count
        assert [d["id"] for d in got[words]["hybrid"]] == [r["chunk_id"] for r in hybrid["results"]], words
        assert [d["id"] for d in got[words]["hybrid"]] == [c for c, _, _ in doc_ranking(pg_url, words,
                                                                                         query_vector(words, DIMS))]
        assert [d["id"] for d in got[words]["vector"]] == [r["chunk_id"] for r in vector["results"]], words
        for doc in got[words]["hybrid"] + got[words]["vector"]:
            row = view[doc["id"]]
            assert doc["page_content"] == row["text"]
            assert doc["metadata"] == {k: str(row[k]) if k == "day" else row[k] for k in KEPT}

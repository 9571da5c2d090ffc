"""Other --keep-columns on a living DIR: the next --sync adopts them (every row made again from
the input, every vector reused, nothing paid), `plan` says so, and the publish follows as a build."""
from __future__ import annotations

import json

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.cli import main
from tests.e2e.money_helpers import MODEL, corpus_rows
from transforms.schemas import OUTPUT_COLUMNS
from tests.publish.helpers import assert_same, published

SCHEMA = pa.schema([("id", pa.string()), ("text", pa.string()), ("title", pa.string()), ("module", pa.int32())])


def write(path, rows) -> None:
    rows = [{**r, "title": f"title of {r['id']}", "module": i % 5} for i, r in enumerate(rows)]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)


def plan(days, corpus, capsys, *flags) -> dict:
    capsys.readouterr()
    assert main(["plan", "--input", str(corpus), "--output", str(days.out), "--model", MODEL, "--base-url",
                 days.base_url, "--models-config", str(days.models), "--json", *flags]) == 0
    return json.loads(capsys.readouterr().out)


def kept_of_view(out) -> set[tuple[str, ...]]:
    """The kept columns of every file of the view (one set: one schema)."""
    return {tuple(n for n in pq.read_schema(f).names if n not in OUTPUT_COLUMNS)
            for f in (out / "current").glob("embeddings-*.parquet")}


def table_columns(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT column_name FROM information_schema.columns WHERE table_name = "
                                           "'embeddings' ORDER BY ordinal_position")]


def test_a_sync_adopts_other_kept_columns_at_no_cost_and_the_publish_builds(days, pg_url, tmp_path, capsys):
    corpus = tmp_path / "corpus.parquet"
    write(corpus, corpus_rows(n_short=12, n_long=2))
    assert days.run_file(corpus) == 0
    assert published(capsys, days.out, pg_url)["action"] == "built"
    paid = days.sandbox_ledger()

    estimate = plan(days, corpus, capsys, "--sync", "--keep-columns", "title,module")
    assert (estimate["requests"], estimate["estimated_cost_rub"]) == (0, 0)
    assert days.run_file(corpus, "--sync", "--keep-columns", "title,module") == 0
    assert days.sandbox_ledger() == paid
    assert kept_of_view(days.out) == {("title", "module")}
    report = published(capsys, days.out, pg_url)
    assert report["action"] == "rebuilt"
    assert table_columns(pg_url)[-2:] == ["title", "module"]
    assert assert_same(days.out, pg_url) == report["rows"] > 0
    with psycopg.connect(pg_url) as conn:
        titles = dict(conn.execute("SELECT doc_id, title FROM embeddings").fetchall())
    assert titles and all(title == f"title of {doc}" for doc, title in titles.items())

    assert days.run_file(corpus, "--sync", "--keep-columns", "title") == 0   # a kept column removed
    assert days.sandbox_ledger() == paid
    assert kept_of_view(days.out) == {("title",)}
    assert published(capsys, days.out, pg_url)["action"] == "rebuilt"
    assert "module" not in table_columns(pg_url)
    assert_same(days.out, pg_url)

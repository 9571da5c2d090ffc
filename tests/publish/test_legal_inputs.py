"""Every legal input publishable, or refused before anything is sent or written: a document id
longer than a btree entry holds, kept column names the published table could not have (its own
columns' names, names PostgreSQL would cut, names readers folding case cannot tell apart)."""
from __future__ import annotations

import random
import string

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.e2e.money_helpers import MODEL, corpus_rows
from tests.publish.helpers import assert_same, published

LONG_ID = "".join(random.Random(5).choices(string.ascii_letters + string.digits, k=3001))   # does not compress


def write(path, rows, **extra: pa.DataType) -> None:
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), *extra.items()])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def test_a_document_id_of_3001_characters_publishes_and_takes_deltas(days, pg_url, tmp_path, capsys):
    """Ids that fit the key's btree keep it (a foreign key of the user's may refer to it); the
    first longer one makes the table key on the ids' md5, and later deltas go on."""
    rows = corpus_rows(n_short=40, n_long=1)
    write(tmp_path / "c.parquet", rows)
    assert days.run_file(tmp_path / "c.parquet") == 0
    assert published(capsys, days.out, pg_url)["action"] == "built"
    rows.append({"id": LONG_ID, "text": "a document whose id is longer than a btree entry"})
    write(tmp_path / "c.parquet", rows)
    assert days.run_file(tmp_path / "c.parquet", "--sync") == 0
    assert published(capsys, days.out, pg_url)["action"] == "rebuilt"
    assert_same(days.out, pg_url)
    rows[-1]["text"] += " Edited."
    write(tmp_path / "c.parquet", rows)
    assert days.run_file(tmp_path / "c.parquet", "--sync") == 0
    report = published(capsys, days.out, pg_url)
    assert report["action"] == "delta" and report["updated"] == 1
    assert_same(days.out, pg_url)
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET enable_seqscan = off")   # a few dozen rows: a scan would be cheaper
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN SELECT * FROM embeddings WHERE doc_id = %s", (LONG_ID,)))
    assert "Index Scan" in plan and "_doc" in plan, plan


def plan_and_run(days, corpus, capsys, *flags) -> list[tuple[int, str]]:
    """(exit code, stderr's last line) of `plan` and of `run` with FLAGS, as processes would end."""
    found = []
    for command in ("plan", "run"):
        capsys.readouterr()
        code = main([command, "--input", str(corpus), "--output", str(days.out), "--model", MODEL, "--base-url",
                     days.base_url, "--models-config", str(days.models), *flags])
        found.append((code, capsys.readouterr().err.strip()))
    return found


@pytest.mark.parametrize("names, words", [
    (["_ep_hash"], "kept column _ep_hash has the name of a column the published table computes itself"),
    (["_ep_bucket"], "kept column _ep_bucket has the name of a column"),
    (["chunk_id"], "kept column chunk_id has the name of a column the published table computes itself"),
    (["Text_TSV"], "kept column Text_TSV has the name of a column the published table computes itself"),
    (["x" * 64], f"kept column {'x' * 64} has a name of 64 bytes, which PostgreSQL would cut to 63"),
    (["ы" * 32], "has a name of 64 bytes"),
    (["lang", "LANG"], "kept column LANG differs from the column lang only by case"),
    (["Doc_ID"], "kept column Doc_ID differs from the column doc_id only by case"),
])
def test_a_kept_name_the_table_could_not_have_is_refused_by_run_and_plan(days, tmp_path, capsys, caplog, names,
                                                                          words):
    corpus = tmp_path / "c.parquet"
    write(corpus, [{"id": "a", "text": "hello", **{n: "v" for n in names}}], **{n: pa.string() for n in names})
    for code, _ in plan_and_run(days, corpus, capsys, "--keep-columns", ",".join(names)):
        assert code == 2
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 2 and all(words in r and "\n" not in r for r in refusals), refusals
    assert days.sandbox_ledger() == [] and not days.out.exists()

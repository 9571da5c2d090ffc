"""Kept columns across the runs of a DIR: one schema for its whole view. Other kept columns are
adopted by a --sync at no cost; a type an input widens widens the view; a narrower one is written
as the view's; any other change is refused by run and plan before anything is sent."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from transforms.schemas import OUTPUT_COLUMNS
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, corpus_rows, current, ledger, run, start_sandbox,
                                     summary, write_models)


@pytest.fixture
def day(tmp_path, sandbox_factory, env_key):
    """run(rows, fields, *flags) against one DIR and one sandbox; FIELDS: kept name -> Arrow type."""
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    out, count = tmp_path / "out", [0]

    def go(rows, fields: dict, *flags, command="run"):
        count[0] += 1
        corpus = tmp_path / f"corpus-{count[0]}.parquet"
        schema = pa.schema([("id", pa.string()), ("text", pa.string()), *fields.items()])
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), corpus)
        if command == "run":
            return run(corpus, out, sandbox, models, *flags)
        return main(["plan", "--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url",
                     sandbox.base_url, "--models-config", str(models), *flags])
    go.out, go.ledger = out, lambda: ledger(sandbox)
    go.run_input = lambda path, *flags: run(path, out, sandbox, models, *flags)
    go.resume = lambda *flags: main(["run", "--output", str(out), "--model", MODEL, "--base-url", sandbox.base_url,
                                     "--models-config", str(models), "--resume", *flags])
    return go


def view_schemas(out, kinds=("embeddings", "pending")) -> set[tuple]:
    """(name, type) of the kept columns of every file of the view, one tuple per distinct schema."""
    found = set()
    for kind in kinds:
        for f in (out / "current").glob(f"{kind}-*.parquet"):
            schema = pq.read_schema(f)
            found.add(tuple((n, str(schema.field(n).type)) for n in schema.names if n not in OUTPUT_COLUMNS))
    return found


@pytest.fixture
def env_key(monkeypatch):
    from tests.conftest import SANDBOX_KEY
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def test_columns_adopted_under_a_budget_stop_leave_one_schema(day):
    """The day that adopts a kept column also edits a document, and the budget stops: every row
    of the view has the new column; the edited document is served as far as it got, and the
    next run completes it."""
    rows = corpus_rows(n_short=10, n_long=1)
    assert day(rows, {}) == 0
    paid = len(day.ledger())
    rows[3] = {**rows[3], "text": rows[3]["text"] + " An edit the budget stops."}
    tagged = [{**r, "lang": f"lang-{i % 3}"} for i, r in enumerate(rows)]
    assert day(tagged, {"lang": pa.string()}, "--sync", "--keep-columns", "lang", "--allow-partial",
               "--max-spend-rub", "0.000001") == 4
    assert len(day.ledger()) == paid
    assert view_schemas(day.out) == {(("lang", "string"),)}
    assert summary(day.out)["current"]["pending"] > 0
    assert_every_row_once(day.out, rows)
    assert day(tagged, {"lang": pa.string()}, "--sync", "--keep-columns", "lang") == 0
    assert len(day.ledger()) == paid + 1 and summary(day.out)["current"]["pending"] == 0
    assert view_schemas(day.out) == {(("lang", "string"),)}
    assert_every_row_once(day.out, rows)


def test_a_narrower_input_is_written_as_the_view_s_type_and_nothing_is_rewritten(day):
    rows = [{**r, "n": i} for i, r in enumerate(corpus_rows(n_short=6, n_long=0)[:6])]
    assert day(rows, {"n": pa.int64()}, "--keep-columns", "n") == 0
    files, paid = set(summary(day.out)["files"]), len(day.ledger())
    rows.append({"id": "new", "text": "one more document", "n": 7})
    assert day(rows, {"n": pa.int32()}, "--sync", "--keep-columns", "n") == 0
    assert len(day.ledger()) == paid + 1 and summary(day.out)["changes"]["unchanged"] == 6
    assert view_schemas(day.out) == {(("n", "int64"),)}
    assert files <= set(summary(day.out)["files"])   # the first run's files stay as they are


@pytest.mark.parametrize("was, now", [
    (pa.int64(), pa.string()), (pa.float64(), pa.int64()), (pa.int64(), pa.float64()),
    (pa.timestamp("us"), pa.timestamp("us", tz="UTC")), (pa.timestamp("us"), pa.timestamp("ns")),
    (pa.list_(pa.int32()), pa.struct([("a", pa.int32())])),
])
def test_a_type_change_that_loses_values_is_refused_by_run_and_plan(day, caplog, was, now):
    rows = [{**r, "v": None} for r in corpus_rows(n_short=4, n_long=0)[:4]]   # the types alone differ
    assert day(rows, {"v": was}, "--keep-columns", "v") == 0
    paid = day.ledger()
    caplog.clear()
    assert day(rows, {"v": now}, "--sync", "--keep-columns", "v", command="plan") == 2
    assert day(rows, {"v": now}, "--sync", "--keep-columns", "v") == 2
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 2 and all("\n" not in r for r in refusals), refusals
    said = [r.replace("<element:", "<item:") for r in refusals]   # a list read back from Parquet names its item so
    assert all(f"kept column v is {was} in the view" in r and f"and {now} in --input" in r for r in said), refusals
    assert day.ledger() == paid


def test_an_input_of_files_of_two_widths_is_one_type(day, tmp_path):
    """An input's own files are joined by the same rule."""
    folder = tmp_path / "two"
    folder.mkdir()
    for prefix, type_, value in (("a-", pa.int16(), 3), ("b-", pa.uint32(), 2 ** 32 - 1)):
        schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("n", type_)])
        rows = [{**r, "n": value} for r in corpus_rows(n_short=3, n_long=0, prefix=prefix)[:3]]
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), folder / f"{prefix}.parquet")
    assert day.run_input(folder, "--keep-columns", "n") == 0
    assert view_schemas(day.out) == {(("n", "int64"),)}
    values = {r["doc_id"][:2]: r["n"] for f in (day.out / "current").glob("embeddings-*.parquet")
              for r in pq.read_table(f, columns=["doc_id", "n"]).to_pylist()}
    assert values == {"a-": 3, "b-": 2 ** 32 - 1}


def test_a_widened_view_resumes_its_pending_rows_as_its_type(day):
    """Pending rows of the narrower type are cast with the rest; --resume alone sends them."""
    rows = [{**r, "n": i} for i, r in enumerate(corpus_rows(n_short=12, n_long=0)[:12])]
    assert day(rows, {"n": pa.int32()}, "--keep-columns", "n", "--allow-partial", "--max-spend-rub", "0.01") == 4
    assert summary(day.out)["current"]["pending"] > 0 and summary(day.out)["current"]["embedded"] > 0
    rows.append({"id": "big", "text": "a value past int32", "n": 2 ** 40})
    assert day(rows, {"n": pa.int64()}, "--resume", "--keep-columns", "n", "--allow-partial", "--max-spend-rub",
               "0.000001") == 4
    assert view_schemas(day.out) == {(("n", "int64"),)}
    assert day.resume() == 0
    assert summary(day.out)["current"]["pending"] == 0
    assert view_schemas(day.out) == {(("n", "int64"),)}
    values = {r["doc_id"]: r["n"] for f in (day.out / "current").glob("embeddings-*.parquet")
              for r in pq.read_table(f, columns=["doc_id", "n"]).to_pylist()}
    assert values == {r["id"]: r["n"] for r in rows}


def test_a_switch_adopts_the_kept_columns_in_both_views(day, caplog):
    """--sync --switch-model with other --keep-columns: the served view adopts them at no cost,
    the other model's view is built with them."""
    rows = corpus_rows(n_short=6, n_long=0)[:6]
    assert day(rows, {}) == 0
    paid = len(day.ledger())
    tagged = [{**r, "lang": "en"} for r in rows]
    caplog.clear()
    assert day(tagged, {"lang": pa.string()}, "--sync", "--keep-columns", "lang", "--switch-model", "--model",
               "text-embedding-ada-002") == 0
    assert "this run makes every row again with ['lang']" in caplog.text
    assert summary(day.out)["switch"]["switched"] is True
    assert {r["model"] for r in current(day.out, "embeddings").to_pylist()} == {"text-embedding-ada-002"}
    assert {c["model"] for c in day.ledger()[paid:]} == {"text-embedding-ada-002"}
    assert view_schemas(day.out) == {(("lang", "string"),)}
    assert_every_row_once(day.out, rows)


@pytest.mark.parametrize("type_, value, words", [
    (pa.timestamp("ns"), 1_000_000_001, "holds a value finer than a microsecond"),
    (pa.duration("ns"), 7, "holds a value finer than a microsecond"),
    (pa.date32(), 3_000_000, "holds a date outside the years 1 to 9999"),
    (pa.timestamp("ms", tz="UTC"), -10 ** 15, "holds a date outside the years 1 to 9999"),
])
def test_a_kept_time_a_run_cannot_carry_is_refused_before_anything_is_sent(day, tmp_path, caplog, type_, value,
                                                                             words):
    """Kept values travel as Python's dates and times: one they do not hold is found by the
    driver, not by a worker half way through the job."""
    rows = corpus_rows(n_short=4, n_long=0)[:4]
    path = tmp_path / "times.parquet"
    pq.write_table(pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                             "t": pa.array([value] + [None] * 3, type_)}), path)
    assert day.run_input(path, "--keep-columns", "t") == 2
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 1 and f"kept column t ({type_}) {words}" in refusals[0], refusals
    assert day.ledger() == [] and not list(day.out.rglob("*.parquet"))

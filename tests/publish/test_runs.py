"""`run ... --publish TARGET`: after every kind of run (sync, resume, a budget-stopped day, the
runs of a model switch) the table is DIR's current view bit for bit, and a reader polling it
meanwhile sees the state before or the state after, whole, and never an error."""
from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from pipeline.cli import main
from pipeline.publish.checks import shared_tables
from pipeline.publish.target import Database
from tests.e2e.money_helpers import MODEL, REPO, corpus_rows, start_sandbox, write_corpus
from tests.e2e.test_switch import OTHER, run, write_models
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, summary
from tests.publish.reader import Reader, snapshot
from tests.publish.stops import holding, publish_waits_on


@pytest.fixture
def setup(tmp_path, sandbox_factory, env_key):
    models = write_models(tmp_path / "models.yaml")
    return tmp_path / "corpus.parquet", tmp_path / "out", start_sandbox(sandbox_factory, models), models


def state(url: str) -> frozenset:
    with psycopg.connect(url) as conn:
        return snapshot(conn)


def test_each_kind_of_run_is_published_whole(setup, pg_url, caplog):
    corpus, out, sb, models = setup
    day = corpus_rows(n_short=60, n_long=3)
    write_corpus(corpus, day)
    assert run(corpus, out, sb, models, MODEL, "--publish", pg_url) == 0
    assert_same(out, pg_url)
    assert summary(out)["publish"]["action"] == "built"

    for n, flags in enumerate((["--sync"], ["--sync", "--allow-partial", "--max-spend-rub", "0.002"], ["--resume"])):
        day, _ = next_day(day, seed=n + 1, edit_short=4, edit_long=1, remove=2, add=6)
        write_corpus(corpus, day)
        before = state(pg_url)
        with Reader(pg_url) as reader:
            code = run(*([] if flags == ["--resume"] else [corpus]), out, sb, models, MODEL, *flags,
                       "--publish", pg_url) if flags != ["--resume"] else \
                run_resume(out, sb, models, pg_url)
        after = state(pg_url)
        assert reader.errors == [] and reader.seen <= {before, after}, flags
        assert_same(out, pg_url)
        s = summary(out)
        assert code == s["exit_code"] and s["publish"]["pending"] == s["current"]["pending"]
        if "--allow-partial" in flags:
            assert code == 4 and s["current"]["pending"] > 0 and s["publish"]["action"] == "delta"


def run_resume(out, sb, models, url) -> int:
    """--resume without --input: the view's pending rows."""
    return main(["run", "--output", str(out), "--model", MODEL, "--base-url", sb.base_url, "--models-config",
                 str(models), "--resume", "--publish", url])


def test_a_switch_serves_the_old_model_until_it_completes_then_swaps_whole(setup, pg_url):
    corpus, out, sb, models = setup
    day = corpus_rows(n_short=60, n_long=3)
    write_corpus(corpus, day)
    assert run(corpus, out, sb, models, MODEL, "--publish", pg_url) == 0
    code = run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--allow-partial", "--max-spend-rub",
               "0.01", "--publish", pg_url)
    assert code == 4 and not summary(out)["switch"]["switched"]
    assert {m for *_, m in state(pg_url)} == {MODEL}
    assert_same(out, pg_url)
    before = state(pg_url)
    with Reader(pg_url) as reader:
        assert run(corpus, out, sb, models, OTHER, "--sync", "--switch-model", "--publish", pg_url) == 0
    after = state(pg_url)
    assert {m for *_, m in after} == {OTHER} and summary(out)["publish"]["action"] == "rebuilt"
    assert reader.errors == [] and reader.seen <= {before, after} and after in reader.seen
    assert_same(out, pg_url)
    with psycopg.connect(pg_url) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
        assert len([t for t in tables if t.startswith("embedpipe_data_")]) == 1
        assert not [t for t in tables if t.startswith("embedpipe_staging_")]


def test_the_publish_of_a_run_holds_dir_until_it_ends(days, tmp_path, pg_url):
    """`run --publish` publishes while it still holds DIR's lock: another run is refused
    meanwhile, so the table serves the view this run committed and summary.json is this run's."""
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=30, n_long=1))
    argv = ["run", "--input", str(corpus), "--output", str(days.out), "--model", MODEL, "--base-url",
            days.base_url, "--models-config", str(days.models), "--sync"]
    config = tmp_path / "pipeline.yaml"   # the swap waits for the lock, rather than trying again
    config.write_text("publish:\n  lock_timeout_ms: 600000\n")
    with psycopg.connect(pg_url, autocommit=True) as conn:   # the table a lock is held on
        shared_tables(conn, Database(pg_url, "test"), "public", 10)
    with holding(pg_url, "LOCK TABLE embedpipe_published IN SHARE MODE"):   # the publish stops at its swap
        first = subprocess.Popen([sys.executable, "-m", "pipeline", *argv, "--publish", pg_url, "--run-config",
                                  str(config)], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            publish_waits_on(pg_url, first, "embedpipe_published")
            assert main(argv) == 2   # the lock: another run is writing DIR
        except BaseException:
            first.kill()
            raise
    out, _ = first.communicate(timeout=120)
    assert first.returncode == 0
    s = summary(days.out)
    assert out.startswith(f"run {s['run_id']} ") and s["publish"]["view"] == s["current"]["view"] == s["run_id"]
    assert_same(days.out, pg_url)


def test_a_switch_of_chunk_size_is_published_with_its_passages(setup, pg_url):
    """Other chunks are another view of the same model: the table keeps serving the old chunks
    until the switch completes, then every row is the new chunks', their text with them."""
    corpus, out, sb, models = setup
    write_corpus(corpus, corpus_rows(n_short=30, n_long=3))
    assert run(corpus, out, sb, models, MODEL, "--publish", pg_url) == 0
    before = state(pg_url)
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model", "--chunk-tokens", "64", "--allow-partial",
               "--max-spend-rub", "0.001", "--publish", pg_url) == 4
    assert state(pg_url) == before and not summary(out)["switch"]["switched"]
    assert run(corpus, out, sb, models, MODEL, "--sync", "--switch-model", "--chunk-tokens", "64", "--publish",
               pg_url) == 0
    assert summary(out)["switch"]["switched"]
    assert_same(out, pg_url)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT max(n_tokens) <= 64, count(*) FILTER (WHERE text = '') FROM embeddings"
                            ).fetchone() == (True, 0)

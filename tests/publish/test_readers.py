"""Readers of NAME across a build's swap (a switch to a model of another length): a REPEATABLE
READ or SERIALIZABLE transaction whose snapshot predates the new rows, and statements prepared
before the swap, read one whole view, never an error. The swap waits for such transactions
(publish.snapshot_wait_s, then the publish fails and NAME stays), and NAME's `embedding` is
`vector` whatever the length, so a prepared statement keeps its result type."""
from __future__ import annotations

import contextlib

import psycopg
import pytest
import yaml
from psycopg import IsolationLevel

from tests.e2e.money_helpers import MODEL, corpus_rows, start_sandbox, write_corpus
from tests.e2e.test_switch import OTHER, run, write_models
from tests.publish.helpers import assert_same, publish
from tests.publish.stops import data_tables, start

READ = "SELECT doc_id, chunk_index, token_start, model, embedding FROM embeddings WHERE chunk_index >= %s"
LEVELS = (IsolationLevel.REPEATABLE_READ, IsolationLevel.SERIALIZABLE)


@pytest.fixture
def switched(tmp_path, sandbox_factory, env_key):
    """A DIR published with MODEL (32 dimensions), then switched to OTHER (48): its next
    publish builds OTHER's table and swaps it in."""
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=30, n_long=1)), tmp_path / "out"

    def switch(url: str) -> None:
        assert run(corpus, out, sandbox, models, MODEL) == 0
        assert publish(out, url) == 0
        assert run(corpus, out, sandbox, models, OTHER, "--sync", "--switch-model") == 0
    switch.out = out
    return switch


def whole(conn: psycopg.Connection, prepare: bool | None = True) -> frozenset:
    """What CONN reads of NAME through a prepared statement: each row's key, model and length."""
    return frozenset((d, c, t, m, e.count(",") + 1) for d, c, t, m, e in conn.execute(READ, (0,), prepare=prepare))


def state(url: str) -> frozenset:
    with psycopg.connect(url) as conn:
        return whole(conn, prepare=False)


@contextlib.contextmanager
def begun(url: str):
    """A REPEATABLE READ and a SERIALIZABLE transaction that hold a snapshot (a first statement
    that reads nothing of NAME, so no lock of it either)."""
    conns = [psycopg.connect(url) for _ in LEVELS]
    try:
        for conn, level in zip(conns, LEVELS, strict=True):
            conn.isolation_level = level
            conn.execute("SELECT 1")
        yield conns
    finally:
        for conn in conns:
            conn.close()


def said_waiting(proc) -> bool:
    """Whether the publish PROC says it waits for older transactions, before it ends."""
    for line in proc.stderr:
        if "transactions begun before" in line:
            return True
    return False


def test_every_reader_reads_one_whole_view_across_a_switch_to_another_length(switched, pg_url):
    switched(pg_url)
    before = state(pg_url)
    assert {(m, n) for *_, m, n in before} == {(MODEL, 32)}
    with psycopg.connect(pg_url, autocommit=True) as auto, begun(pg_url) as readers:
        for _ in range(6):   # psycopg prepares it by itself from the 5th execution on
            assert whole(auto, prepare=None) == before
        assert auto.execute("SELECT count(*) FROM pg_prepared_statements WHERE statement = %s",
                            (READ.replace("%s", "$1"),)).fetchone() == (1,)
        proc = start(switched.out, pg_url)
        try:
            said_waiting(proc)   # the new table is built; the swap waits for the readers' transactions
            for conn in readers:
                assert whole(conn) == before   # the old view, whole: they hold it now, and the swap waits
            assert whole(auto) == before
            for conn in readers:
                conn.commit()
            out, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
        finally:
            proc.kill()
        after = state(pg_url)
        assert {(m, n) for *_, m, n in after} == {(OTHER, 48)}
        assert whole(auto, prepare=None) == after   # prepared on the 32-dimension NAME: the same result type
        for conn in readers:
            assert whole(conn) == after
            conn.commit()
    assert_same(switched.out, pg_url)


def test_a_transaction_older_than_the_new_rows_past_the_wait_fails_the_publish_and_the_table_stays(
        switched, pg_url, tmp_path, caplog):
    switched(pg_url)
    before = state(pg_url)
    config = tmp_path / "pipeline.yaml"
    config.write_text(yaml.safe_dump({"publish": {"snapshot_wait_s": 0.5}}))
    with begun(pg_url) as readers:
        pids = sorted(conn.info.backend_pid for conn in readers)
        caplog.clear()
        assert publish(switched.out, pg_url, "--run-config", str(config)) == 1
        said = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(said) == 1 and "publish.snapshot_wait_s" in said[0] and "then publish again" in said[0]
        assert all(f"{pid} (postgres, " in said[0] for pid in pids), said
        for conn in readers:
            assert whole(conn) == before
    assert state(pg_url) == before and len(data_tables(pg_url)) == 2   # the new table stays unserved
    assert publish(switched.out, pg_url) == 0   # drops it, builds again, swaps
    assert {(m, n) for *_, m, n in state(pg_url)} == {(OTHER, 48)} and len(data_tables(pg_url)) == 1

"""Publishes at once: one publisher per table (a second one waits for it in the server, then is
refused in one line), and publishes of other tables go on, the first of two tables in one
schema at once included."""
from __future__ import annotations

import psycopg

from pipeline.publish.database import advisory_key
from tests.e2e.money_helpers import corpus_rows
from tests.publish.helpers import assert_same, publish
from tests.publish.stops import PUBLISHING, holding, publish_waits_on, served_table, start, until, waits


def test_a_second_publisher_of_the_same_table_is_refused_and_others_go_on(day1, pg_url, tmp_path, caplog):
    assert publish(day1, pg_url) == 0
    config = tmp_path / "pipeline.yaml"
    config.write_text("publish:\n  lock_wait_s: 0.5\n")
    with holding(pg_url, f"LOCK TABLE {served_table(pg_url)} IN ACCESS EXCLUSIVE MODE"):
        first = start(day1, pg_url)
        publish_waits_on(pg_url, first, served_table(pg_url))   # holding NAME's lock
        assert publish(day1, pg_url, "--run-config", str(config)) == 1
        assert "another publish of public.embeddings is under way" in caplog.text
        assert publish(day1, pg_url, "--run-config", str(config), "--table", "other") == 0
    assert first.wait(120) == 0, first.stderr.read()
    assert_same(day1, pg_url)
    assert_same(day1, pg_url, "other")


def test_a_second_publisher_waits_in_the_server_and_goes_on_when_the_first_ends(day1, pg_url):
    """Its wait is the server's (pg_advisory_lock under lock_timeout): pg_locks shows it, and
    it goes on the moment the lock is free."""
    with holding(pg_url, f"SELECT pg_advisory_lock({advisory_key('publish public.embeddings')})") as first:
        second = start(day1, pg_url)
        until(lambda: waits(pg_url, "a.application_name LIKE %s AND l.locktype = 'advisory'", (PUBLISHING,)),
              "the second publisher waiting for the first's lock", second)
        first.execute("SELECT pg_advisory_unlock_all()")
        assert second.wait(120) == 0, second.stderr.read()
    assert_same(day1, pg_url)


def test_two_first_publishes_of_two_tables_in_one_schema_at_once(days, pg_url):
    """Both make the tables a schema's publishes share, and pgvector, at the same moment: here,
    once a session that was making pgvector rolls back, with both publishes waiting for it."""
    assert days(corpus_rows(n_short=20, n_long=1)) == 0
    with holding(pg_url, "CREATE EXTENSION vector") as other:
        procs = [start(days.out, pg_url, "--table", name) for name in ("one", "two")]
        until(lambda: len({pid for pid, *_ in waits(pg_url, "a.application_name LIKE %s", (PUBLISHING,))}) == 2,
              "both publishes waiting", procs[0])
        other.rollback()
        for proc in procs:
            assert proc.wait(120) == 0, proc.stderr.read()
    for name in ("one", "two"):
        assert_same(days.out, pg_url, name)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM embedpipe_published").fetchone() == (2,)

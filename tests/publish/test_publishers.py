"""Publishes at once: one publisher per table (a second one waits for it in the server), and
the first publishes of two tables in one schema at once."""
from __future__ import annotations

import psycopg

from pipeline.publish.database import advisory_key
from tests.e2e.money_helpers import corpus_rows
from tests.publish.helpers import assert_same
from tests.publish.stops import PUBLISHING, holding, start, until, waits


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

"""Publishes at once: one publisher per table (a second one waits for it in the server)."""
from __future__ import annotations

from pipeline.publish.database import advisory_key
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

"""A reader polling the published table while something publishes: every answer must be one
whole state of the table (the one before or the one after), and no query may fail."""
from __future__ import annotations

import threading
import time

import psycopg
from psycopg import sql

from tests.publish.helpers import relation


def snapshot(conn: psycopg.Connection, table: str = "embeddings") -> frozenset:
    return frozenset(conn.execute(sql.SQL("SELECT doc_id, chunk_index, token_start, run_id, model FROM {}")
                                  .format(relation(table))).fetchall())


class Reader(threading.Thread):
    """Polls TABLE at URL until stopped: the distinct states seen, the errors met."""

    def __init__(self, url: str, table: str = "embeddings"):
        super().__init__(daemon=True)
        self.url, self.table = url, table
        self.seen: set[frozenset] = set()
        self.errors: list[str] = []
        self.polls = 0
        self._done = threading.Event()

    def run(self):
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("SET enable_seqscan = off")   # the nearest-neighbour query goes through the index
            while not self._done.is_set():
                try:
                    self.seen.add(snapshot(conn, self.table))
                    conn.execute(sql.SQL("SELECT doc_id FROM {t} ORDER BY embedding <=> (SELECT embedding FROM {t} "
                                         "LIMIT 1) LIMIT 3").format(t=relation(self.table))).fetchall()
                    self.polls += 1
                except psycopg.Error as exc:
                    self.errors.append(str(exc))
                time.sleep(0.005)

    def __enter__(self):
        self.start()
        while not self.polls and not self.errors:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        """Stopped after a poll begun once the body ended (the one in flight may have read the
        state before its last commit): the state the body left is among those seen."""
        polls, errors, deadline = self.polls, len(self.errors), time.monotonic() + 30
        while self.polls < polls + 2 and len(self.errors) == errors and time.monotonic() < deadline:
            time.sleep(0.005)
        self._done.set()
        self.join(30)

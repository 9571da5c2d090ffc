"""Stopping a publish at a step from the database's side: a session of the test holds a lock
that the publish needs at that step, and the publish is seen waiting for it in pg_locks; then
the test kills it, drops its connection, restarts the server, or lets it go on."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import psycopg
from psycopg import sql

from tests.e2e.money_helpers import REPO

PUBLISHING = "embedpipe publish%"   # the launcher's sessions and its workers'


def start(out, url: str, *extra: str) -> subprocess.Popen:
    """`python -m pipeline publish OUT --to URL` in a process of its own."""
    return subprocess.Popen([sys.executable, "-m", "pipeline", "publish", str(out), "--to", url, *extra], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@contextlib.contextmanager
def holding(url: str, *statements: str) -> Iterator[psycopg.Connection]:
    """A session that runs STATEMENTS (LOCK TABLE ...) in a transaction and holds their locks
    until the block ends or it rolls back itself (a server restart ends it too)."""
    conn = psycopg.connect(url)
    try:
        for statement in statements:
            conn.execute(statement)
        yield conn
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        conn.close()


@contextlib.contextmanager
def queued(url: str, statement: str) -> Iterator[None]:
    """STATEMENT (a LOCK TABLE that must wait) sent by a session of its own, and queued for its
    lock before the block runs; its transaction held until the block ends."""
    conn = psycopg.connect(url)
    pid, done = conn.info.backend_pid, threading.Event()
    thread = threading.Thread(target=lambda: (conn.execute(statement), done.wait()), daemon=True)
    thread.start()
    try:
        until(lambda: waits(url, "l.pid = %s", (pid,)), f"{statement} to queue")
        yield
    finally:
        done.set()
        thread.join(30)
        with contextlib.suppress(psycopg.Error):
            conn.rollback()
        conn.close()


def waits(url: str, where: str, params: tuple = ()) -> list[tuple[int, str, str]]:
    """(pid, lock mode, application) of the sessions waiting for a lock, WHERE (on pg_locks l
    and pg_stat_activity a) holds."""
    with psycopg.connect(url, autocommit=True) as conn:
        return conn.execute(sql.SQL("SELECT l.pid, l.mode, a.application_name FROM pg_locks l JOIN pg_stat_activity "
                                    "a USING (pid) WHERE NOT l.granted AND {}").format(sql.SQL(where)),
                            params).fetchall()


def until(check, what: str, proc: subprocess.Popen | None = None, timeout_s: float = 180):
    """CHECK()'s first true value; an error when PROC ends first or TIMEOUT_S passes."""
    deadline = time.monotonic() + timeout_s
    while not (found := check()):
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"the publish ended (exit {proc.returncode}) before {what}: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout_s} s")
        time.sleep(0.05)
    return found


def publish_waits_on(url: str, proc: subprocess.Popen, relation: str, mode: str | None = None) -> int:
    """Once a session of the publish PROC waits for a lock on RELATION (in MODE): its pid."""
    where = "a.application_name LIKE %s AND l.relation = to_regclass(%s)" + (" AND l.mode = %s" if mode else "")
    params = (PUBLISHING, relation, *((mode,) if mode else ()))
    return until(lambda: waits(url, where, params), f"the publish waiting on {relation}", proc)[0][0]


def data_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'embedpipe\\_data\\_%' "
                                           "AND relkind = 'r' ORDER BY oid")]


def served_table(url: str, name: str = "embeddings") -> str:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT record->>'data_table' FROM embedpipe_published WHERE name = %s",
                            (name,)).fetchone()[0]

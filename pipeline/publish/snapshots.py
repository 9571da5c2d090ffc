"""Before NAME reads a new data table: the transactions whose snapshot predates the table's
rows, waited for (as CREATE INDEX CONCURRENTLY waits for older snapshots).

A REPEATABLE READ or SERIALIZABLE transaction keeps the snapshot of its first statement, and
PostgreSQL reads a view's definition as it is now: one begun before the new table's rows were
committed would find NAME reading a table whose rows it cannot see, an empty NAME. So the swap
waits, at most publish.snapshot_wait_s, until every session of the database that holds a
snapshot older than those rows (pg_stat_activity's backend_xmin, which every role may read)
has let it go; after that the publish fails and NAME serves what it did.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import psycopg

from pipeline.exits import JobFailed
from pipeline.publish.names import Names
from pipeline.settings.config import PublishSettings
from pipeline.terminal.figures import count
from transforms.publish.sql import one

log = logging.getLogger("embedpipe")

POLL_S = 0.1   # between two looks at the sessions: a reader's transaction usually ends within ms

# The client sessions of this database (background processes have no user) holding a
# snapshot older than %(limit)s: xids compare by age (they wrap), the older the larger. Not
# those of publishes (another NAME's index build, say, holds a snapshot for minutes): their
# statements each take a snapshot of their own and read no NAME in an older one.
_OLDER = """
SELECT pid, backend_xmin::text, coalesce(usename, '?'), coalesce(nullif(application_name, ''), '?')
FROM pg_stat_activity
WHERE datid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND pid <> pg_backend_pid()
    AND usesysid IS NOT NULL AND backend_xmin IS NOT NULL AND age(backend_xmin) > age(%(limit)s::xid)
    AND NOT starts_with(coalesce(application_name, ''), 'embedpipe publish')"""


def wait_for_older_snapshots(conn: psycopg.Connection, names: Names, settings: PublishSettings) -> float:
    """Once every snapshot that cannot see the rows committed so far has gone (each session
    found holding one: its snapshot changed, or it has none, or it ended): the seconds waited.
    JobFailed when some are still held after publish.snapshot_wait_s."""
    limit = one(conn.execute("SELECT xid(pg_snapshot_xmax(pg_current_snapshot()))::text"))[0]
    held = {pid: (xmin, user, app) for pid, xmin, user, app in conn.execute(_OLDER, {"limit": limit})}
    started = time.monotonic()
    if held:
        log.info("%s is about to read its new rows: waiting for %s begun before they were written (server "
                 "processes %s), at most %s s (publish.snapshot_wait_s)", names.qualified,
                 count(len(held), "transaction"), _listed(held), f"{settings.snapshot_wait_s:g}")
    while held:
        if time.monotonic() - started > settings.snapshot_wait_s:
            raise JobFailed(f"transactions begun before the new rows of {names.qualified} were written still hold "
                            f"their snapshots after {settings.snapshot_wait_s:g} s (publish.snapshot_wait_s), and "
                            f"would read it empty (server processes {_listed(held)}): end them, or raise the "
                            "setting, then publish again; it serves what it did")
        time.sleep(POLL_S)
        now = {pid: xmin for pid, xmin, *_ in conn.execute(_OLDER, {"limit": limit})}
        held = {pid: found for pid, found in held.items() if now.get(pid) == found[0]}
    return round(time.monotonic() - started, 3)


def _listed(held: dict[int, tuple[Any, str, str]]) -> str:
    return ", ".join(f"{pid} ({user}, {app})" for pid, (_, user, app) in sorted(held.items()))

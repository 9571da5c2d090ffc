"""Claims shared by the local runner's worker processes: one SQLite file (no Beam here).

With several local worker processes, a text's rows may come in any of them. The first process
to claim the text sends it; another process's rows of it are late: after the job they get a copy
of what became of the claiming row, as rows that come after a text was sent do in one process
(transforms/dedupe/distinct.py). So the run streams, as in one process, instead of grouping
every chunk's text in the runner's memory. The standard library's SQLite gives the atomic
"first claim wins" across processes without a server. The late rows go to the file as well,
since the driver cannot read a worker process's memory. The file is local: the local runner's
workers share the driver's disk, and distributed runners group instead.

The same file is the pool of the input's row groups and tables that the worker processes pull
from (`take`), so that the work follows each process's pace.

The driver keeps it in a directory of its own (`claim_dir`), locked for as long as the job
runs: a job killed with SIGKILL leaves the directory, with each late row's kept columns, and
the next job on the machine removes every such directory whose lock is free.
"""
from __future__ import annotations

import contextlib
import fcntl
import glob
import os
import pickle
import shutil
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterator

_BUSY_TIMEOUT_S = 60.0   # another process's write holds the file for microseconds
_PREFIX = "embedpipe-claims-"
_OWNER = "owner.lock"
_UNLOCKED_GRACE_S = 60.0   # a directory without its lock file yet may be one being made


@contextlib.contextmanager
def claim_dir(parent: str | None = None) -> Iterator[str]:
    """A new directory for a job's claim file under PARENT (the temporary directory), locked
    while the job runs and removed after it; stale ones of killed jobs are removed first."""
    parent = parent or tempfile.gettempdir()
    sweep_stale(parent)
    path = tempfile.mkdtemp(prefix=_PREFIX, dir=parent)
    try:
        with open(os.path.join(path, _OWNER + ".new"), "w") as owner:
            fcntl.flock(owner, fcntl.LOCK_EX)   # freed by the kernel when this process dies
            os.rename(owner.name, os.path.join(path, _OWNER))   # seen by a sweep only once locked
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep_stale(parent: str) -> list[str]:
    """Remove the claim directories under PARENT that no live job holds; return them."""
    swept = []
    for path in glob.glob(os.path.join(glob.escape(parent), _PREFIX + "*")):
        try:
            with open(os.path.join(path, _OWNER)) as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue   # a live job's
        except FileNotFoundError:
            try:
                if time.time() - os.path.getmtime(path) < _UNLOCKED_GRACE_S:
                    continue
            except FileNotFoundError:
                continue   # its job removed it meanwhile
        except OSError:
            continue   # not ours to judge (another user's, say)
        shutil.rmtree(path, ignore_errors=True)
        swept.append(path)
    return swept


class ClaimFile:
    """A claim file at PATH, created by `create` before the job; each process connects on first use."""

    def __init__(self, path: str):
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        ClaimFile.__init__(self, state["path"])

    @classmethod
    def create(cls, path: str) -> ClaimFile:
        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")   # readers do not wait for writers, nor writers for readers
            db.execute("CREATE TABLE claims (key BLOB PRIMARY KEY, first BLOB NOT NULL) WITHOUT ROWID")
            db.execute("CREATE TABLE late (ref BLOB NOT NULL)")
            db.execute("CREATE TABLE taken (key BLOB PRIMARY KEY) WITHOUT ROWID")
        finally:
            db.close()
        return cls(path)

    def _connection(self) -> sqlite3.Connection:
        if self._db is None:
            db = sqlite3.connect(self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA synchronous=OFF")   # a file for one job: a crash of the machine ends the job anyway
            self._db = db
        return self._db

    def claim(self, key: bytes, first: bytes) -> bytes | None:
        """None when this call claimed KEY with FIRST (its row); else the FIRST of the claim that won."""
        with self._lock:
            db = self._connection()
            if db.execute("INSERT OR IGNORE INTO claims VALUES (?, ?)", (key, first)).rowcount == 1:
                return None
            return db.execute("SELECT first FROM claims WHERE key = ?", (key,)).fetchone()[0]

    def take(self, key: bytes) -> bool:
        """Whether this call took KEY (a part of the input: transforms/read/parquet.py's Pull)."""
        with self._lock:
            return self._connection().execute("INSERT OR IGNORE INTO taken VALUES (?)", (key,)).rowcount == 1

    def taken(self, key: bytes) -> bool:
        """Whether any call took KEY."""
        with self._lock:
            return self._connection().execute("SELECT 1 FROM taken WHERE key = ?", (key,)).fetchone() is not None

    def add_late(self, late) -> None:
        """Keep a late row (a LateRef) for the driver."""
        with self._lock:
            self._connection().execute("INSERT INTO late VALUES (?)", (pickle.dumps(late),))

    def late(self) -> list:
        """Every process's late rows."""
        with self._lock:
            rows = self._connection().execute("SELECT ref FROM late").fetchall()
        return [pickle.loads(blob) for (blob,) in rows]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

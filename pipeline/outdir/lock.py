"""One live writer per output directory (a run, or a search recording its paid query):
DIR/_lock.json names the run that holds it.

On a local disk the lock is created with O_EXCL, so two runs cannot both take it; a holder on
this host is alive while its pid is and its heartbeat is fresher than the lease (a pid reused
after a reboot does not hold the lock forever), a holder on another host (a shared mount)
while its heartbeat is fresh. Object stores (gs://, s3://) offer no create-if-absent
through Beam's FileSystems: there the lock is a lease, written, read back (the last writer
wins a race) and refreshed by the driver; a lease older than `lock.lease_s` is stale. Two runs
started within the same instant on an object store can therefore both start: the lease makes
the common case (a retry while the first attempt still runs) safe, not every race.
"""
from __future__ import annotations

import datetime as dt
import json
import os
import socket
import threading
import time
import uuid
from typing import Any

from apache_beam.io.filesystems import FileSystems

from pipeline.exits import UsageError
from pipeline.outdir.jsonfiles import read_json, write_json
from pipeline.outdir.view import is_local
from pipeline.settings.config import LockSettings

LOCK_FILE = "_lock.json"
RUN_AGAIN = "run the same command again, with --resume if it has neither --resume nor --sync"


class OutputLocked(UsageError):
    """Another live run is writing the same --output (exit 2)."""


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class OutputLock:
    """A context manager: holds DIR's lock for the run, refreshing its heartbeat, and releases
    it on the way out (a SIGKILLed run leaves it behind; the next run finds it stale)."""

    def __init__(self, output_dir: str, run_id: str, settings: LockSettings, again: str = RUN_AGAIN):
        """AGAIN: what the holder's command is to do once the other run is gone."""
        self._path = FileSystems.join(output_dir, LOCK_FILE)
        self._again = again
        self._local = is_local(self._path)
        self._settings = settings
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.holder = {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(),
                       "started_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                       "heartbeat": time.time()}

    def __enter__(self) -> OutputLock:
        (self._acquire_local if self._local else self._acquire_lease)()
        self._thread = threading.Thread(target=self._beat, name="output-lock", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if (self._read() or {}).get("run_id") == self.holder["run_id"]:
            FileSystems.delete([self._path])

    def _alive(self, other: dict[str, Any]) -> bool:
        fresh = time.time() - float(other.get("heartbeat", 0)) < self._settings.lease_s
        if other.get("host") == self.holder["host"] and self._local:
            return fresh and pid_alive(int(other.get("pid", -1)))
        return fresh

    def _refuse(self, other: dict[str, Any]) -> None:
        raise OutputLocked(
            f"--output {FileSystems.split(self._path)[0]} is being written by another run: run "
            f"{other.get('run_id')} on host {other.get('host')}, pid {other.get('pid')}, started "
            f"{other.get('started_at')} (lock {self._path}). Wait for it to finish (or stop it), then "
            f"{self._again}; the lock of a run that is gone is ignored (on another host or an object store once its heartbeat is "
            f"{self._settings.lease_s:g} s old).")

    def _acquire_local(self) -> None:
        for _ in range(3):
            try:
                fd = os.open(self._path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                other = self._read()
                if other is None:  # being written right now, or unreadable: look again
                    time.sleep(0.05)
                    continue
                if self._alive(other):
                    self._refuse(other)
                self._take_over_local(other)
                continue
            try:
                with os.fdopen(fd, "w") as fh:
                    json.dump(self.holder, fh)
            except BaseException:   # a full disk: an empty lock would refuse every later run
                os.remove(self._path)
                raise
            return
        other = self._read()
        self._refuse(other or {"run_id": "unknown (unreadable lock file)"})

    def _take_over_local(self, stale: dict[str, Any]) -> None:
        """Move the stale lock aside; if another run replaced it meanwhile, put theirs back."""
        aside = f"{self._path}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self._path, aside)
        except FileNotFoundError:
            return  # another run moved it first
        with open(aside) as fh:
            moved = json.load(fh)
        if moved.get("run_id") != stale.get("run_id"):
            os.rename(aside, self._path)
            self._refuse(moved)
        os.remove(aside)

    def _acquire_lease(self) -> None:
        other = self._read()
        if other is not None and self._alive(other):
            self._refuse(other)
        self._write()
        time.sleep(min(1.0, self._settings.heartbeat_s))  # let a racing writer land first
        if (mine := self._read()) is None or mine.get("run_id") != self.holder["run_id"]:
            self._refuse(mine or {})

    def _beat(self) -> None:
        while not self._stop.wait(self._settings.heartbeat_s):
            self.holder["heartbeat"] = time.time()
            try:
                self._write()
            except Exception:  # a missed beat only shortens the lease; the next one retries
                pass

    def _write(self) -> None:
        write_json(self._path, self.holder)

    def _read(self) -> dict[str, Any] | None:
        try:
            holder: dict[str, Any] | None = read_json(self._path)
            return holder
        except Exception:  # half-written by a racing run (O_EXCL), or gone meanwhile
            return None

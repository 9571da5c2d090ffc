"""The output lock's decisions without a pipeline: a live holder refuses, a dead or silent one
is stale; on object stores (a lease) only the heartbeat's age tells."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from pipeline.outdir import lock
from pipeline.outdir.lock import LOCK_FILE, OutputLock, OutputLocked
from pipeline.settings.config import LockSettings

FAST = LockSettings(heartbeat_s=0.05, lease_s=1.0)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def beat(directory) -> float:
    return json.loads((directory / LOCK_FILE).read_text())["heartbeat"]


def test_a_live_holder_refuses_and_is_named(tmp_path):
    with OutputLock(str(tmp_path), "run-a", FAST):
        with pytest.raises(OutputLocked, match=r"run run-a on host .*, pid \d+, started"):
            OutputLock(str(tmp_path), "run-b", FAST).__enter__()
    assert not (tmp_path / LOCK_FILE).exists()


def test_the_lock_of_a_dead_process_on_this_host_is_stale(tmp_path):
    with OutputLock(str(tmp_path), "run-a", FAST) as held:
        holder = dict(held.holder)
    (tmp_path / LOCK_FILE).write_text(json.dumps({**holder, "pid": dead_pid(), "heartbeat": time.time()}))
    with OutputLock(str(tmp_path), "run-b", FAST):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["run_id"] == "run-b"


def test_a_live_pid_with_a_silent_heartbeat_is_stale(tmp_path):
    """After a reboot the pid may belong to another process: the heartbeat tells."""
    with OutputLock(str(tmp_path), "run-a", FAST) as held:
        holder = dict(held.holder)
    (tmp_path / LOCK_FILE).write_text(json.dumps({**holder, "heartbeat": time.time() - 2 * FAST.lease_s}))
    with OutputLock(str(tmp_path), "run-b", FAST):
        assert json.loads((tmp_path / LOCK_FILE).read_text())["run_id"] == "run-b"


def test_a_lease_is_stale_only_once_its_heartbeat_is_old(tmp_path, monkeypatch):
    monkeypatch.setattr(lock, "is_local", lambda path: False)
    other = {"run_id": "run-a", "host": "elsewhere", "pid": 1, "started_at": "earlier"}
    (tmp_path / LOCK_FILE).write_text(json.dumps({**other, "heartbeat": time.time()}))
    with pytest.raises(OutputLocked, match="run run-a on host elsewhere"):
        OutputLock(str(tmp_path), "run-b", FAST).__enter__()
    (tmp_path / LOCK_FILE).write_text(json.dumps({**other, "heartbeat": time.time() - 2 * FAST.lease_s}))
    with OutputLock(str(tmp_path), "run-b", FAST):
        first, deadline = beat(tmp_path), time.monotonic() + 30
        while beat(tmp_path) == first:  # the holder's heartbeat keeps the lease fresh
            assert time.monotonic() < deadline, "the lease was never refreshed"
            time.sleep(FAST.heartbeat_s)
    assert not (tmp_path / LOCK_FILE).exists()

"""Shared fixtures: sandboxes as real subprocesses on free loopback ports, stopped at teardown."""
from __future__ import annotations

import os

import pytest

from service.sandbox.launcher import SandboxProcess

SANDBOX_KEY = "sk-test-key"

# Loopback only: a proxy configured in the environment must never see sandbox traffic (or keys).
os.environ["NO_PROXY"] = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if p)


@pytest.fixture
def sandbox_factory(tmp_path_factory):
    """Call with SandboxProcess's arguments (db defaults to a fresh temporary file); returns a
    started sandbox. Every one is stopped at teardown."""
    started: list[SandboxProcess] = []

    def make(db=None, **kwargs) -> SandboxProcess:
        if db is None:
            db = tmp_path_factory.mktemp("sandbox") / "sandbox.db"
        sb = SandboxProcess(db, **kwargs)
        started.append(sb)
        return sb.start()

    yield make
    for sb in started:
        sb.stop()


@pytest.fixture
def sandbox(sandbox_factory) -> SandboxProcess:
    """A default sandbox: key "sk-test-key", balance 1000 RUB, no budget, no faults."""
    return sandbox_factory(key=SANDBOX_KEY, balance=1000.0)

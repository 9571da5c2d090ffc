"""One live run per output directory: a second `run` on an --output that a live run is writing is
refused at once (exit 2, naming the other run) without touching its files, and the lock a
SIGKILLed run leaves behind does not block `--resume`."""
from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (REPO, assert_every_row_once, billed_twice, corpus_rows, job_argv, ledger, run,
                                     start_job, start_sandbox, wait_for_journal, write_corpus, write_models)

LATENCY_MS = 300  # slow enough that the first run is still sending when the second one starts


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def listing(out) -> set[str]:
    return {str(p.relative_to(out)) for p in out.rglob("*")}


def test_a_second_run_is_refused_and_a_killed_runs_lock_is_stale(tmp_path, sandbox_factory, env_key):
    rows = corpus_rows(n_short=200, n_long=1)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    slow = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    out, log = tmp_path / "out", tmp_path / "first.log"
    first = start_job(corpus, out, slow, models, log)
    try:
        wait_for_journal(first, out, 1, log)
        holder = json.loads((out / "_lock.json").read_text())
        assert holder["pid"] == first.pid
        before = listing(out)
        second = subprocess.run(job_argv(corpus, out, slow, models, "--resume"), cwd=REPO, capture_output=True,
                                text=True, env={**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}, timeout=120)
        assert first.poll() is None, "the first run ended before the second was refused: make it slower"
        assert second.returncode == 2, second.stderr[-3000:]
        assert holder["run_id"] in second.stderr and f"pid {first.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        # the second run wrote nothing: every name added meanwhile is the first run's journal
        added = listing(out) - before
        assert all(holder["run_id"] in name or name.startswith("_lock.json") for name in added), added
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    slow.kill()  # no charge after the kill: every billed text is one the journal may hold
    assert (out / "_lock.json").exists(), "a SIGKILLed run cannot release its lock"

    sb = start_sandbox(sandbox_factory, models, db=slow.db)
    assert run(corpus, out, sb, models, "--resume") == 0
    assert not (out / "_lock.json").exists(), "a finished run releases the lock"
    # at most the one request in flight at the kill (--max-in-flight 1) is billed again
    twice = billed_twice(ledger(sb))
    assert len({c["request_id"] for c in ledger(sb) if set(c["input_sha256"]) & set(twice)}) <= 2
    assert assert_every_row_once(out, rows)["pending"] == 0

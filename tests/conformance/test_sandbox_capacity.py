"""The sandbox's capacity (--capacity N): at most N embeddings requests per account worked on at
once; past it a request queues (--capacity-mode queue) or is refused with 429 and Retry-After
(--capacity-mode 429), uncharged. Sandbox only: a real service's capacity is not ours to set.

Nothing is timed: each step waits until /healthz shows the state it needs (a request worked
on, one queued), so the order of events is certain, not likely.
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import time

import pytest
import requests

from service.sandbox.launcher import SandboxProcess

pytestmark = pytest.mark.skipif(bool(os.environ.get("BASE_URL")), reason="the sandbox's own setting")

ACCOUNTS = os.path.join(os.path.dirname(__file__), "..", "..", "configs", "sandbox", "accounts.example.yaml")
KEY_A, KEY_A2 = "sk-sandbox-team-a-main", "sk-sandbox-team-a-capped"   # one account, two keys
KEY_OTHER = "sk-sandbox-team-b"   # another account


def _post(sb: SandboxProcess, key: str, text: str) -> requests.Response:
    return requests.post(sb.base_url + "/embeddings", timeout=60, headers={
        "Authorization": f"Bearer {key}", "X-Request-Id": text},
        json={"model": "text-embedding-3-small", "input": [text]})


def _health(sb: SandboxProcess) -> dict:
    return requests.get(sb.base_url.removesuffix("/v1") + "/healthz", timeout=10).json()["capacity"]


def _until(sb: SandboxProcess, **want) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        report = _health(sb)
        if all(report[k] == v for k, v in want.items()):
            return report
        time.sleep(0.02)
    raise AssertionError(f"healthz never showed {want}: {report}")


@pytest.fixture
def capacity_sandbox(tmp_path):
    started = []

    def make(*args) -> SandboxProcess:
        sb = SandboxProcess(tmp_path / f"sb{len(started)}.db", key=None, balance=None,
                            args=["--accounts", ACCOUNTS, "--latency-ms", "1500", *args])
        started.append(sb)
        return sb.start()

    yield make
    for sb in started:
        sb.stop()


def test_no_capacity_by_default(capacity_sandbox):
    sb = capacity_sandbox()
    with cf.ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(_post, sb, KEY_A, f"t{i}") for i in range(3)]
        _until(sb, in_progress=3)
        assert all(f.result().status_code == 200 for f in futures)
    report = _health(sb)
    assert report["capacity"] is None and report["peak_queued"] == 0 and report["refused"] == 0


def test_queue_mode_queues_past_capacity_per_account(capacity_sandbox):
    sb = capacity_sandbox("--capacity", "1")
    with cf.ThreadPoolExecutor(3) as pool:
        first = pool.submit(_post, sb, KEY_A, "first")
        _until(sb, in_progress=1)
        second = pool.submit(_post, sb, KEY_A2, "second")   # same account, another key
        _until(sb, in_progress=1, queued=1)
        other = pool.submit(_post, sb, KEY_OTHER, "other")  # another account: its own place
        _until(sb, in_progress=2, queued=1)
        assert [f.result().status_code for f in (first, second, other)] == [200, 200, 200]
    report = _health(sb)
    assert report["peak_in_progress"] == 1 and report["peak_queued"] == 1 and report["refused"] == 0
    charged = [row["request_id"] for row in sb.ledger()]
    assert charged.index("first") < charged.index("second")   # the queued one is worked on after


def test_429_mode_refuses_past_capacity_uncharged(capacity_sandbox):
    sb = capacity_sandbox("--capacity", "1", "--capacity-mode", "429", "--capacity-retry-after-s", "2")
    with cf.ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, sb, KEY_A, "first")
        _until(sb, in_progress=1)
        refused = _post(sb, KEY_A2, "refused")
        assert refused.status_code == 429 and refused.headers["Retry-After"] == "2"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert _post(sb, KEY_OTHER, "other").status_code == 200   # another account is not refused
        assert first.result().status_code == 200
    assert _post(sb, KEY_A2, "after").status_code == 200   # a free place again
    assert {row["request_id"] for row in sb.ledger()} == {"first", "other", "after"}
    report = _health(sb)
    assert report["refused"] == 1 and report["peak_queued"] == 0

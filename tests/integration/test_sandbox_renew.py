"""A sandbox started in another's process (SandboxProcess.start_in, what the tests' sandbox_factory
does to save a process start per test) starts as a new process would: nothing of the sandbox
it replaces is left, neither its balance, ledger, key, fault counts nor rate limits."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests

from service.sandbox.launcher import SandboxError, SandboxProcess

MODEL = "text-embedding-3-small"
# A sandbox in a state a test may leave: one request drains the balance, the key is revoked after
# three requests, embeddings and the balance endpoint rate limited after two calls and one.
WORN = ["--revoke-after", "3", "--embeddings-rps", "0.001", "--embeddings-burst", "2",
        "--account-rps", "0.001", "--account-burst", "1"]
WORN_BALANCE = 0.000005   # RUB: the price of "some words" (2 tokens at 2.5 RUB per million)


def _embed(sb: SandboxProcess, key: str, text: str = "some words") -> requests.Response:
    return requests.post(sb.base_url + "/embeddings", headers={"Authorization": f"Bearer {key}"}, timeout=30,
                         json={"model": MODEL, "input": text})


def _balance(sb: SandboxProcess, key: str) -> requests.Response:
    return requests.get(sb.base_url + "/service/balance", headers={"Authorization": f"Bearer {key}"}, timeout=10)


def _health(sb: SandboxProcess) -> dict:
    return requests.get(sb.base_url.removesuffix("/v1") + "/healthz", timeout=10).json()


def _wear(sb: SandboxProcess, key: str) -> None:
    """Bring a sandbox of WORN's flags from its start to the worn state, checking each step."""
    assert _balance(sb, key).json() == {"balance": WORN_BALANCE} and sb.ledger() == []
    assert _balance(sb, key).status_code == 429
    assert [_embed(sb, key).status_code for _ in range(4)] == [200, 402, 429, 401]
    assert _health(sb)["faults_injected"]["revoked"] == 1 and len(sb.ledger()) == 1


@pytest.fixture
def worn(tmp_path):
    sb = SandboxProcess(tmp_path / "worn.db", key="sk-worn", balance=WORN_BALANCE, args=WORN, renewable=True).start()
    _wear(sb, "sk-worn")
    yield sb
    sb.stop()


def test_a_sandbox_started_in_a_worn_ones_process_is_new(worn, tmp_path):
    port, pid, worn_ledger = worn.port, worn.pid, worn.ledger()
    with SandboxProcess(tmp_path / "new.db", key="sk-new", balance=5.0, renewable=True).start_in(worn) as sb:
        assert (sb.port, sb.pid) == (port, pid) and not worn.running()   # the same process
        assert _balance(sb, "sk-new").json() == {"balance": 5.0}
        assert _embed(sb, "sk-worn").status_code == 401                    # the old key is gone
        for i in range(8):   # no revocation, no rate limit (the default burst is 10 balance calls)
            assert _embed(sb, "sk-new", f"text {i}").status_code == 200
            assert _balance(sb, "sk-new").status_code == 200
        assert set(_health(sb)["faults_injected"].values()) == {0}
        assert len(sb.ledger()) == 8 and worn.ledger() == worn_ledger
        log = Path(sb.log_path).read_text()
        assert "serving http://" in log and "new.db" in log and "worn.db" not in log and "sk-new" not in log


def test_the_same_arguments_again_start_from_the_beginning(worn, tmp_path):
    """What the factory does most: the flags of the last test, a new database."""
    again = SandboxProcess(tmp_path / "again.db", key="sk-worn", balance=WORN_BALANCE, args=WORN, renewable=True)
    with again.start_in(worn) as sb:
        _wear(sb, "sk-worn")


def test_a_request_in_flight_ends_in_the_old_sandbox(tmp_path):
    slow = SandboxProcess(tmp_path / "slow.db", key="sk-slow", balance=5.0, args=["--latency-ms", "1500"],
                          renewable=True).start()
    answers: list[int] = []
    caller = threading.Thread(target=lambda: answers.append(_embed(slow, "sk-slow").status_code))
    caller.start()
    while _health(slow)["capacity"]["in_progress"] == 0:
        assert caller.is_alive(), answers
    with SandboxProcess(tmp_path / "next.db", key="sk-next", balance=5.0, renewable=True).start_in(slow) as sb:
        caller.join()
        assert answers == [200] and len(slow.ledger()) == 1 and sb.ledger() == []
        assert _embed(sb, "sk-next").status_code == 200 and len(slow.ledger()) == 1


def test_arguments_a_process_would_refuse_end_the_process_as_they_would(worn, tmp_path):
    bad = SandboxProcess(tmp_path / "bad.db", key="sk-bad", balance=1.0, args=["--tz", "Mars/Olympus"],
                         renewable=True)
    with pytest.raises(SandboxError, match="exited with 2(.|\n)*unknown time zone"):
        bad.start_in(worn)
    assert not bad.running() and not worn.running()


def test_only_a_running_renewable_sandbox_can_take_another(tmp_path):
    plain = SandboxProcess(tmp_path / "plain.db", key="sk-plain", balance=1.0).start()
    try:
        with pytest.raises(SandboxError, match="cannot serve"):
            SandboxProcess(tmp_path / "x.db", renewable=True).start_in(plain)
        assert plain.running()
    finally:
        plain.stop()


def test_the_tests_sandbox_factory_starts_each_sandbox_new_in_a_spare_process(sandbox_factory, spare_sandboxes,
                                                                              worn):
    pid = worn.pid
    spare_sandboxes.append(worn)
    sb = sandbox_factory(key="sk-worn", balance=WORN_BALANCE, args=WORN)
    assert sb.pid == pid
    _wear(sb, "sk-worn")

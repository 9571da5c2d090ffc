"""EmbeddingsClient against the sandbox subprocess over real HTTP: results, statuses, faults."""
from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from service import errors as E
from service.catalog import load_models
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY

MODEL = "text-embedding-3-small"
FAST = RetryPolicy(max_attempts=8, initial_backoff_s=0.01, max_backoff_s=0.05, max_total_s=30,
                   connect_timeout_s=2, read_timeout_s=5)
TEXTS = ["The quick brown fox", "Съешь же ещё этих мягких французских булок", "def f(x): return x"]


def client_for(sb, key=SANDBOX_KEY, **kw) -> EmbeddingsClient:
    return EmbeddingsClient(sb.base_url, ApiKey(key), **{"retry": FAST, **kw})


def test_float_and_base64_give_equal_vectors_and_exact_usage(sandbox):
    spec = load_models()[MODEL]
    enc = get_encoding("cl100k_base")
    tokens = sum(len(enc.encode_ordinary(t)) for t in TEXTS)
    with client_for(sandbox) as b64, client_for(sandbox, encoding_format="float") as flt:
        r1 = b64.embed(MODEL, TEXTS)
        r2 = flt.embed(MODEL, TEXTS)
    assert r1.vectors.dtype == np.float32 and r1.vectors.shape == (3, spec.dimensions)
    assert np.array_equal(r1.vectors, r2.vectors)
    assert b64.encoding_format == "base64"          # the sandbox honours base64: no fallback
    u = r1.usage
    assert (u.prompt_tokens, u.total_tokens) == (tokens, tokens)
    assert u.cost_rub == round(tokens * spec.price_per_token, 6) > 0
    assert r2.usage.balance == pytest.approx(1000 - 2 * u.cost_rub, abs=1e-9)
    assert (r1.status, r1.attempts, r1.uncertain_attempts, r1.model) == (200, 1, 0, MODEL)
    ledger = sandbox.ledger()
    assert [row["request_id"] for row in ledger] == [r1.request_id, r2.request_id]


def test_dimensions_and_given_request_id(sandbox):
    with client_for(sandbox) as c:
        res = c.embed(MODEL, ["short"], dimensions=256, request_id="pipeline-req-0001")
    assert res.vectors.shape == (1, 256) and res.request_id == "pipeline-req-0001"
    assert sandbox.ledger()[0]["request_id"] == "pipeline-req-0001"


def test_balance_budget_and_stats(sandbox_factory):
    sb = sandbox_factory(key="sk-budget", balance=50.0, budget=2.5)
    with client_for(sb, key="sk-budget") as c:
        before = c.balance()
        res = c.embed(MODEL, TEXTS[:1])
        after, stats = c.balance(), c.stats()
    assert (before.balance, before.budget) == (50.0, 2.5)
    assert after.balance == pytest.approx(50.0 - res.usage.cost_rub) == res.usage.balance
    assert after.budget == pytest.approx(2.5 - res.usage.cost_rub)
    assert stats.daily_usage == stats.monthly_usage == pytest.approx(res.usage.cost_rub)


def test_unknown_model_is_a_bad_request_raised_at_once(sandbox):
    with client_for(sandbox) as c, pytest.raises(E.BadRequestError) as info:
        c.embed("no-such-model", ["x"])
    e = info.value
    assert type(e) is E.BadRequestError and e.code == "model_not_found" and e.status == 400
    assert e.attempts == 1 and not e.retryable and "no-such-model" in e.message


def test_over_length_input_gives_the_numbers(sandbox):
    spec = load_models()["vendorF-embeddings-2"]
    text = "token " * (spec.max_input_tokens + 40)
    n = len(get_encoding("cl100k_base").encode_ordinary(text))
    with client_for(sandbox) as c, pytest.raises(E.ContextLengthExceededError) as info:
        c.embed(spec.name, ["fine", text])
    assert (info.value.max_tokens, info.value.requested_tokens) == (spec.max_input_tokens, n)
    assert info.value.attempts == 1 and sandbox.ledger() == []


def test_bad_key_is_401_everywhere(sandbox):
    with client_for(sandbox, key="sk-wrong") as c:
        for call in (lambda: c.embed(MODEL, ["x"]), c.balance, c.stats):
            with pytest.raises(E.AuthenticationError) as info:
                call()
            assert info.value.status == 401 and info.value.attempts == 1


def test_insufficient_balance_is_402_and_not_charged(sandbox_factory):
    sb = sandbox_factory(key="sk-poor", balance=0.000001)
    with client_for(sb, key="sk-poor") as c, pytest.raises(E.InsufficientBalanceError) as info:
        c.embed(MODEL, ["a longer text that costs more than one millionth of a rouble " * 3])
    assert info.value.status == 402 and info.value.attempts == 1 and sb.ledger() == []


def _retry_waits(caplog) -> list[float]:
    return [float(r.getMessage().split("retrying in ")[1].split(" s")[0])
            for r in caplog.records if "retrying in" in r.getMessage()]


def test_429_on_balance_waits_at_least_retry_after(sandbox_factory, caplog, record_property):
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0, args=["--account-rps", "1", "--account-burst", "1"])
    with client_for(sb) as c, caplog.at_level(logging.INFO, logger="service.client"):
        c.balance()                                    # takes the only token
        started = time.monotonic()
        c.balance()                                    # 429 Retry-After: 1, then 200
        took = time.monotonic() - started
    waits = _retry_waits(caplog)
    record_property("balance_429_wall_s", took)
    print(f"\nbalance after 429: planned wait {waits}, measured call {took:.3f} s")
    assert len(waits) == 1 and waits[0] >= 1.0 and took >= 1.0
    assert "HTTP 429" in caplog.records[0].getMessage() and "as the server asked" in caplog.records[0].getMessage()


def test_429_on_embeddings_waits_at_least_retry_after(sandbox_factory, record_property):
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0,
                         args=["--embeddings-rps", "1", "--embeddings-burst", "1"])
    with client_for(sb) as c:
        c.embed(MODEL, ["a"])
        res = c.embed(MODEL, ["b"])
    record_property("embed_429_latency_ms", res.latency_ms)
    print(f"\nembed after 429: attempts {res.attempts}, latency {res.latency_ms:.0f} ms")
    assert res.attempts == 2 and res.uncertain_attempts == 0 and res.latency_ms >= 1000


def _injected(sb) -> dict:
    return requests.get(f"http://127.0.0.1:{sb.port}/healthz", timeout=5).json()["faults_injected"]


def test_fault_profile_transient_retried_and_counted(sandbox_factory):
    faults = ["--seed", "7", "--rate-429", "0.05", "--retry-after-s", "0", "--rate-500", "0.1",
              "--rate-502", "0.05", "--rate-503", "0.05", "--rate-reset", "0.05",
              "--rate-reset-after-charge", "0.05", "--rate-slow", "0.03", "--slow-s", "1.5"]
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=faults)
    policy = RetryPolicy(max_attempts=10, initial_backoff_s=0.01, max_backoff_s=0.05,
                         max_total_s=60, connect_timeout_s=2, read_timeout_s=0.4, read_timeout_max_s=0.4)
    with client_for(sb, retry=policy) as c:
        results = [c.embed(MODEL, [f"text number {i}"]) for i in range(40)]
        with pytest.raises(E.BadRequestError) as info:      # permanent, even under faults
            c.embed("no-such-model", ["x"])
    assert info.value.attempts == 1
    injected = _injected(sb)
    print(f"\ninjected: {injected}")
    assert sum(injected.values()) >= 5, "the profile should inject something"
    assert sum(r.attempts - 1 for r in results) == sum(injected.values())
    # every fault but a 429 happened after the request was sent: the client cannot know
    # whether it was billed
    assert sum(r.uncertain_attempts for r in results) == sum(injected.values()) - injected["status_429"]
    ledger = sb.ledger()
    billed_twice = injected["reset_after_charge"] + injected["slow"]
    assert len(ledger) == len(results) + billed_twice
    # retries of one logical request carry one id, so its double charges are visible
    ids = [row["request_id"] for row in ledger]
    assert set(ids) == {r.request_id for r in results}
    assert len(ids) - len(set(ids)) == billed_twice


def test_exhausted_retries_raise_the_last_error_with_attempts(sandbox_factory):
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0, args=["--rate-503", "1"])
    with client_for(sb, retry=RetryPolicy(max_attempts=3, initial_backoff_s=0.01)) as c:
        with pytest.raises(E.InternalServerError) as info:
            c.embed(MODEL, ["x"])
    e = info.value
    assert (e.status, e.attempts, e.uncertain_attempts) == (503, 3, 3) and "injected" in e.message


def test_concurrent_requests_share_one_client(sandbox):
    batches = [[f"doc {i} part {j}" for j in range(1 + i % 4)] for i in range(64)]
    with client_for(sandbox, pool_size=8) as c, ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda b: c.embed(MODEL, b), batches))
    with client_for(sandbox, encoding_format="float") as c:
        check = c.embed(MODEL, batches[5])
    assert np.array_equal(results[5].vectors, check.vectors)
    assert [r.vectors.shape[0] for r in results] == [len(b) for b in batches]
    assert len(sandbox.ledger()) == 65


def test_the_key_never_appears_on_any_sandbox_error_path(sandbox_factory, caplog):
    key = "sk-sandbox-secret-abcdef0123"
    sb = sandbox_factory(key=key, balance=0.00001,
                         args=["--account-rps", "1", "--account-burst", "1"])
    faulty = sandbox_factory(key=key, balance=10.0, args=["--rate-502", "0.5", "--rate-reset", "0.5"])
    one_try = RetryPolicy(max_attempts=1, max_refusals=0)
    errors = []
    with caplog.at_level(logging.DEBUG):
        with client_for(sb, key=key, retry=one_try) as c, client_for(sb, key="sk-wrong") as bad:
            assert key not in repr(c) and key not in str(vars(c))
            calls = [lambda: c.embed("nope", ["x"]), lambda: c.embed("vendorF-embeddings-2", ["w " * 600]),
                     lambda: c.embed(MODEL, ["costs more than ten micro-roubles " * 20]),
                     lambda: bad.embed(MODEL, ["x"]), c.balance]
            c.balance()                      # takes the only token: the next one is a 429
            for call in calls:
                with pytest.raises(E.EmbeddingsError) as info:
                    call()
                errors.append(info.value)
        with client_for(faulty, key=key, retry=RetryPolicy(max_attempts=2, initial_backoff_s=0.01)) as c:
            for i in range(4):
                try:
                    c.embed(MODEL, [f"x{i}"])
                except E.EmbeddingsError as exc:
                    errors.append(exc)
        faulty.stop()
        with client_for(faulty, key=key, retry=one_try) as c, pytest.raises(E.APIConnectionError) as info:
            c.stats()
        errors.append(info.value)
    kinds = {type(e) for e in errors}
    assert kinds >= {E.BadRequestError, E.ContextLengthExceededError, E.InsufficientBalanceError,
                     E.AuthenticationError, E.RateLimitError, E.APIConnectionError}, kinds
    for e in errors:
        texts = [str(e), repr(e), repr(e.args), repr(vars(e)), repr(e.__cause__), repr(e.__context__)]
        assert not any(key in t for t in texts), type(e)
        assert not any("requests" in type(v).__module__ for v in vars(e).values())
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert not any(key in r.getMessage() or key in repr(r.args) for r in caplog.records)


def _capacity(sb) -> dict:
    return requests.get(f"http://127.0.0.1:{sb.port}/healthz", timeout=5).json()["capacity"]


def test_refusals_do_not_shorten_the_read_timeout_of_the_attempt_the_service_admits(sandbox_factory):
    """Capacity 1 refused with 429, 3 s a request, the place held by another client on the key,
    timeouts 1 s / 10 s. The 429s come back at once: counted as answers, they took the timeout
    to its 1 s floor, the attempt the service admitted timed out after 1 s, was billed, and its
    retry was billed again. No 2xx came, so each attempt waits the ceiling: billed once."""
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0,
                         args=["--capacity", "1", "--capacity-mode", "429", "--latency-ms", "3000"])
    other = client_for(sb)
    holder = ThreadPoolExecutor(1)
    held = holder.submit(other.embed, MODEL, ["another job on the same key"])
    deadline = time.monotonic() + 30
    while _capacity(sb)["in_progress"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    policy = RetryPolicy(max_attempts=6, max_refusals=20, initial_backoff_s=0.01, max_total_s=60,
                         read_timeout_s=1.0, read_timeout_max_s=10.0)
    with client_for(sb, retry=policy) as c:
        res = c.embed(MODEL, ["admitted after a few refusals"])
    held.result(timeout=30)
    holder.shutdown()
    other.close()
    assert _capacity(sb)["refused"] >= 1 and res.attempts >= 2   # it was refused first
    charges = [row for row in sb.ledger() if row["request_id"] == res.request_id]
    assert len(charges) == 1
    assert (res.timed_out_attempts, res.uncertain_attempts) == (0, 0)

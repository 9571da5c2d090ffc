"""Billing under concurrency: 64 client threads x 50 requests over keep-alive connections.

Money is compared in integer micro-roubles: the final balance must equal the initial one
minus every charge, exactly. Timings are measured and printed, never asserted.
"""
from __future__ import annotations

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from service.catalog import load_models
from service.sandbox.money import cost_micro, to_micro
from service.tokenizer import get_encoding

KEY = "sk-load-key"
SMALL = "text-embedding-3-small"
THREADS, PER_THREAD = 64, 50
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}


def _load(sb, make_inputs, threads=THREADS, per_thread=PER_THREAD) -> list[dict]:
    """Every answer as {request_id, status, cost, balance, latency_s}."""
    url = sb.base_url + "/embeddings"
    start = threading.Barrier(threads)

    def worker(t: int) -> list[dict]:
        out = []
        with requests.Session() as s:
            start.wait(30)
            for i in range(per_thread):
                rid = f"t{t}-r{i}"
                body = json.dumps({"model": SMALL, "input": make_inputs(t, i), "encoding_format": "base64"})
                t0 = time.perf_counter()
                r = s.post(url, data=body, headers={**AUTH, "X-Request-Id": rid}, timeout=60)
                row = {"request_id": rid, "status": r.status_code, "latency_s": time.perf_counter() - t0}
                if r.status_code == 200:
                    usage = r.json()["usage"]
                    row.update(cost=to_micro(usage["cost_rub"]), balance=to_micro(usage["balance"]))
                out.append(row)
        return out

    with ThreadPoolExecutor(threads) as pool:
        return [row for rows in pool.map(worker, range(threads)) for row in rows]


def _balance(sb) -> dict:
    return requests.get(sb.base_url + "/service/balance", headers=AUTH, timeout=10).json()


def _check_chain(ledger: list[dict], initial_micro: int) -> None:
    """In charge order, each balance_after is the previous one minus this charge: no lost update."""
    balance = initial_micro
    for row in ledger:
        balance -= to_micro(row["cost_rub"])
        assert to_micro(row["balance_after"]) == balance >= 0


@pytest.mark.soak   # slow: make soak
def test_64_threads_every_charge_accounted_to_the_micro_rouble(sandbox_factory, record_property):
    sb = sandbox_factory(key=KEY, balance=1000.0, budget=900.0)
    t0 = time.perf_counter()
    answers = _load(sb, lambda t, i: [f"thread {t} request {i} " + "word " * (i % 5), f"second {t * i}"])
    elapsed = time.perf_counter() - t0
    assert {a["status"] for a in answers} == {200}
    ledger = sb.ledger()
    assert sorted(r["request_id"] for r in ledger) == sorted(a["request_id"] for a in answers)
    charged = sum(a["cost"] for a in answers)
    assert charged == sum(to_micro(r["cost_rub"]) for r in ledger) > 0
    final = _balance(sb)
    assert to_micro(final["balance"]) == to_micro(1000.0) - charged
    assert to_micro(final["budget"]) == to_micro(900.0) - charged
    _check_chain(ledger, to_micro(1000.0))
    assert len({a["balance"] for a in answers}) == len(answers)   # each charge saw its own balance
    lat = np.array([a["latency_s"] for a in answers]) * 1000
    figures = {"requests": len(answers), "requests_per_s": round(len(answers) / elapsed, 1),
               "p50_ms": round(float(np.percentile(lat, 50)), 2), "p99_ms": round(float(np.percentile(lat, 99)), 2)}
    record_property("sandbox_load", figures)
    print(f"\nsandbox 64x50 load: {figures}")


def test_balance_runs_out_mid_load(sandbox_factory):
    text = "the same few tokens every time"
    cost = cost_micro(len(get_encoding().encode_ordinary(text)), load_models()[SMALL].price_per_token)
    initial = cost * 300 + cost // 2           # room for exactly 300 of the 64 x 10 requests
    sb = sandbox_factory(key=KEY, balance=initial / 1e6)
    answers = _load(sb, lambda t, i: text, per_thread=10)
    assert sum(a["status"] == 200 for a in answers) == 300
    assert {a["status"] for a in answers} == {200, 402}
    ledger = sb.ledger()
    assert len(ledger) == 300 and sum(to_micro(r["cost_rub"]) for r in ledger) <= initial
    assert to_micro(_balance(sb)["balance"]) == initial - 300 * cost == cost // 2
    _check_chain(ledger, initial)
    # after the balance ran out, every later answer of each thread is 402
    by_thread: dict[str, list[int]] = {}
    for a in answers:
        by_thread.setdefault(a["request_id"].split("-")[0], []).append(a["status"])
    for statuses in by_thread.values():
        if 402 in statuses:
            assert set(statuses[statuses.index(402):]) == {402}


def test_key_budget_runs_out_mid_load_and_never_goes_negative(sandbox_factory):
    text = "budget bound request"
    cost = cost_micro(len(get_encoding().encode_ordinary(text)), load_models()[SMALL].price_per_token)
    budget = cost * 200 + 1
    sb = sandbox_factory(key=KEY, balance=1000.0, budget=budget / 1e6)
    answers = _load(sb, lambda t, i: text, threads=16, per_thread=25)
    assert sum(a["status"] == 200 for a in answers) == 200
    assert sum(a["status"] == 402 for a in answers) == 16 * 25 - 200
    final = _balance(sb)
    assert to_micro(final["budget"]) == 1
    assert to_micro(final["balance"]) == to_micro(1000.0) - 200 * cost
    assert len(sb.ledger()) == 200

"""The sandbox under a mixed load: 64 clients for a bounded time, embeddings interleaved with
balance and stats calls. No charge lost, no balance below zero, 429s only where the account
endpoints' rate limit applies. Throughput and latency are printed, never asserted."""
from __future__ import annotations

import collections
import json
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import requests

from service.sandbox.money import to_micro

KEY = "sk-mixed-load"
AUTH = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
CLIENTS, SECONDS = 64, 6.0


def _balance_when_allowed(sb) -> float:
    """The load drained the key's account-call bucket: wait as the 429 says, a few times."""
    for _ in range(5):
        r = requests.get(sb.base_url + "/service/balance", headers=AUTH, timeout=10)
        if r.status_code == 200:
            return r.json()["balance"]
        time.sleep(float(r.headers.get("Retry-After", "1")))
    raise AssertionError("the balance endpoint kept answering 429")


@pytest.mark.soak   # slow: make soak
def test_mixed_load_loses_no_charge_and_limits_only_account_calls(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=50.0)
    deadline = time.monotonic() + SECONDS
    start = threading.Barrier(CLIENTS)

    def client(n: int) -> list[tuple[str, int, float]]:
        rng, seen = random.Random(n), []
        with requests.Session() as s:
            start.wait(30)
            while time.monotonic() < deadline:
                kind = rng.choices(["embeddings", "balance", "stats"], [0.7, 0.15, 0.15])[0]
                t0 = time.perf_counter()
                if kind == "embeddings":
                    body = json.dumps({"model": "text-embedding-3-small", "encoding_format": "base64",
                                       "input": [f"client {n} text {len(seen)}", "shared words here"]})
                    r = s.post(sb.base_url + "/embeddings", data=body, headers=AUTH, timeout=30)
                else:
                    r = s.get(f"{sb.base_url}/service/{kind}", headers=AUTH, timeout=30)
                seen.append((kind, r.status_code, time.perf_counter() - t0))
        return seen

    with ThreadPoolExecutor(CLIENTS) as pool:
        calls = [c for per_client in pool.map(client, range(CLIENTS)) for c in per_client]

    by_kind = collections.Counter((kind, status) for kind, status, _ in calls)
    assert {status for _, status, _ in calls} <= {200, 429}
    assert by_kind[("embeddings", 429)] == 0  # no embeddings rate limit is configured
    assert by_kind[("balance", 429)] + by_kind[("stats", 429)] > 0  # 5/s per key, bursts of 10
    charges = sb.ledger()
    assert len(charges) == by_kind[("embeddings", 200)]  # one ledger row per answered request
    balance = _balance_when_allowed(sb)
    assert to_micro(balance) == to_micro(50.0) - sum(to_micro(c["cost_rub"]) for c in charges) >= 0
    latencies = np.array([lat for kind, status, lat in calls if kind == "embeddings"]) * 1000
    print(f"\nmixed load: {len(calls) / SECONDS:.0f} requests/s over {CLIENTS} clients; embeddings "
          f"p50 {np.percentile(latencies, 50):.1f} ms, p99 {np.percentile(latencies, 99):.1f} ms; {dict(by_kind)}")

"""kill -9 in the middle of a load, restart on the same database: no charge a client saw is
lost, balances and stats survive."""
from __future__ import annotations

import datetime as dt
import threading
import time

import requests

from service.sandbox.money import to_micro

KEY = "sk-crash-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
THREADS = 16


def _stats(sb) -> dict:
    return requests.get(sb.base_url + "/service/stats", headers=AUTH, timeout=10).json()


def _balance(sb) -> int:
    return to_micro(requests.get(sb.base_url + "/service/balance", headers=AUTH, timeout=10).json()["balance"])


def test_kill_9_mid_load_loses_no_charge(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=1000.0)
    received: list[tuple[str, int]] = []   # (request_id, cost) of every 200 a client got
    lock = threading.Lock()

    def worker(t: int) -> None:
        with requests.Session() as s:
            for i in range(10_000):
                rid = f"crash-{t}-{i}"
                try:
                    r = s.post(sb.base_url + "/embeddings", headers={**AUTH, "X-Request-Id": rid}, timeout=10,
                               json={"model": "text-embedding-3-small", "input": [f"text {t} {i}", "more words"],
                                     "encoding_format": "base64"})
                except requests.RequestException:
                    return   # the server is gone
                if r.status_code == 200:
                    with lock:
                        received.append((rid, to_micro(r.json()["usage"]["cost_rub"])))

    threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + 30
    while len(received) < 300 and time.monotonic() < deadline:
        time.sleep(0.01)
    sb.kill()
    for th in threads:
        th.join(30)
    assert not any(th.is_alive() for th in threads)
    assert len(received) >= 100

    sb.restart()
    ledger = sb.ledger()
    ledger_ids = {row["request_id"] for row in ledger}
    assert len(ledger_ids) == len(ledger)
    assert {rid for rid, _ in received} <= ledger_ids           # none the clients saw is lost
    assert len(ledger) - len(received) <= THREADS               # at most one in flight per client
    spent = sum(to_micro(row["cost_rub"]) for row in ledger)
    assert _balance(sb) == to_micro(1000.0) - spent
    assert to_micro(ledger[-1]["balance_after"]) == to_micro(1000.0) - spent

    before = _stats(sb)
    assert to_micro(before["monthly_usage"]) == spent
    today = dt.datetime.now(dt.UTC).date()
    today_spent = sum(to_micro(r["cost_rub"]) for r in ledger
                      if dt.datetime.fromisoformat(r["created_at"]).date() == today)
    assert to_micro(before["daily_usage"]) in (today_spent, spent)   # (spent: the clock passed midnight)

    sb.kill()
    sb.restart()
    assert _stats(sb) == before
    assert _balance(sb) == to_micro(1000.0) - spent
    assert sb.ledger() == ledger

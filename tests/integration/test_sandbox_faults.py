"""Fault injection: the seeded profile produces every configured kind, repeatably; the slow
answer is billed; a revoked key gets 401; the embeddings rate limit answers 429."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import requests
import yaml

from service.sandbox import server as server_module
from service.sandbox.config import build_parser, config_from_args
from service.sandbox.faults import FaultConfig, FaultInjector
from service.sandbox.server import make_server

KEY = "sk-fault-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
PROFILE = {"seed": 42, "rate_429": 0.15, "retry_after_s": 2, "rate_500": 0.1, "rate_502": 0.1,
           "rate_503": 0.1, "rate_reset": 0.1, "rate_reset_after_charge": 0.1, "rate_slow": 0.1,
           "slow_s": 0.05}
CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "sandbox"


def _embed(sb, session, rid: str, timeout=10):
    return session.post(sb.base_url + "/embeddings", headers={**AUTH, "X-Request-Id": rid}, timeout=timeout,
                        json={"model": "text-embedding-3-small", "input": [f"request {rid}"]})


def _outcomes(sb, n: int) -> list[str]:
    out = []
    with requests.Session() as s:
        for i in range(n):
            try:
                r = _embed(sb, s, f"f{i}")
            except requests.ConnectionError:
                out.append("reset")
                continue
            if r.status_code == 429:
                assert r.headers["Retry-After"] == "2" and r.json()["error"]["code"] == 429
            out.append(str(r.status_code))
    return out


def _injected(sb) -> dict:
    return requests.get(sb.base_url.removesuffix("/v1") + "/healthz", timeout=10).json()["faults_injected"]


def test_seeded_profile_produces_every_kind_repeatably(sandbox_factory, tmp_path):
    profile = tmp_path / "faults.yaml"
    profile.write_text(yaml.safe_dump(PROFILE))
    runs = []
    for _ in range(2):
        sb = sandbox_factory(key=KEY, balance=100.0, args=["--faults", str(profile)])
        outcomes = _outcomes(sb, 60)
        injected = _injected(sb)
        assert all(injected[k] > 0 for k in ("status_429", "status_500", "status_502", "status_503",
                                             "reset", "reset_after_charge", "slow")), injected
        for status in ("429", "500", "502", "503"):
            assert outcomes.count(status) == injected["status_" + status]
        assert outcomes.count("reset") == injected["reset"] + injected["reset_after_charge"]
        assert set(outcomes) == {"200", "429", "500", "502", "503", "reset"}
        # billed: every 200 (slow ones included) and every reset after the charge; no reset
        # before answering, no 429 and no 5xx
        assert len(sb.ledger()) == outcomes.count("200") + injected["reset_after_charge"]
        runs.append(outcomes)
    assert runs[0] == runs[1]   # same seed, same request order, same faults


def test_draws_depend_on_the_seed_only():
    def draws(seed: int) -> list:
        injector = FaultInjector(FaultConfig.from_mapping({**PROFILE, "seed": seed}, "test"))
        return [injector.draw() for _ in range(200)]
    assert draws(42) == draws(42) != draws(43)


def test_a_setting_left_empty_keeps_its_default():
    # `rate_429:` with no value in a faults file is YAML's null
    doc = yaml.safe_load("rate_429:\nslow_s:\nrevoke_after:\n")
    assert FaultConfig.from_mapping(doc, "faults.yaml") == FaultConfig()


def test_slow_answer_is_billed_even_when_the_client_gave_up(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=100.0, args=["--rate-slow", "1", "--slow-s", "3"])
    with requests.Session() as s, pytest.raises(requests.ReadTimeout):
        _embed(sb, s, "slow-1", timeout=(5, 0.5))
    assert [row["request_id"] for row in sb.ledger()] == ["slow-1"]


def test_key_revoked_after_n_embeddings_requests(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=100.0, args=["--revoke-after", "3"])
    with requests.Session() as s:
        statuses = [_embed(sb, s, f"rv{i}").status_code for i in range(5)]
        assert statuses == [200, 200, 200, 401, 401]
        wrong = s.post(sb.base_url + "/embeddings", headers={"Authorization": "Bearer nope"},
                       json={"model": "text-embedding-3-small", "input": "x"}, timeout=10)
        revoked = _embed(sb, s, "rv5")
        assert revoked.content == wrong.content   # indistinguishable from a wrong key
        for what in ("balance", "stats"):
            assert s.get(f"{sb.base_url}/service/{what}", headers=AUTH, timeout=10).status_code == 401
    assert len(sb.ledger()) == 3


def test_embeddings_rate_limit_answers_429_with_retry_after(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=100.0, args=["--embeddings-rps", "0.2", "--embeddings-burst", "2"])
    with requests.Session() as s:
        answers = [_embed(sb, s, f"rl{i}") for i in range(4)]
    assert [r.status_code for r in answers[:2]] == [200, 200]
    assert answers[2].status_code == 429 and int(answers[2].headers["Retry-After"]) >= 1
    assert len(sb.ledger()) == sum(r.status_code == 200 for r in answers)


def test_latency_is_waited(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=100.0, args=["--latency-ms", "150", "--latency-per-token-us", "1000"])
    with requests.Session() as s:
        t0 = time.perf_counter()
        r = _embed(sb, s, "lat")
        elapsed = time.perf_counter() - t0
    n = r.json()["usage"]["total_tokens"]
    assert elapsed >= 0.150 + n * 0.001   # a lower bound only: waits are sleeps


def test_the_latency_includes_the_work(tmp_path, monkeypatch):
    # In process, so that the server's sleeps can be seen: it sleeps what is left of the latency
    # once it has counted and embedded, never the whole latency on top of that work.
    config = config_from_args(build_parser().parse_args(
        ["--db", str(tmp_path / "s.db"), "--key", KEY, "--balance", "100", "--port", "0", "--latency-ms", "200"]))
    server, _ = make_server(config)
    slept, sleep = [], time.sleep
    monkeypatch.setattr(server_module.time, "sleep", lambda s: (slept.append(s), sleep(s)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        r = requests.post(f"http://127.0.0.1:{server.server_address[1]}/v1/embeddings", headers=AUTH, timeout=10,
                          json={"model": "text-embedding-3-small", "input": ["the work is part of the latency"]})
    finally:
        server.shutdown()
        server.server_close()
    assert r.status_code == 200
    assert len(slept) == 1 and 0 < slept[0] < 0.200


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("faults-*.yaml")), ids=lambda p: p.name)
def test_example_profiles_are_valid(path):
    args = build_parser().parse_args(["--db", "x.db", "--key", "k", "--balance", "1", "--faults", str(path)])
    faults = config_from_args(args).faults
    assert faults.seed is not None


def test_soak_profile_has_the_documented_mix():
    f = config_from_args(build_parser().parse_args(
        ["--db", "x.db", "--key", "k", "--balance", "1", "--faults", str(CONFIGS / "faults-soak.yaml")])).faults
    assert f.rate_500 + f.rate_502 + f.rate_503 == pytest.approx(0.10)
    assert f.rate_429 == 0.05 and f.retry_after_s >= 1
    assert f.rate_reset + f.rate_reset_after_charge == pytest.approx(0.02) and f.rate_slow == 0.01


@pytest.mark.soak
def test_soak_profile_under_concurrency_bills_exactly_what_it_says(sandbox_factory):
    """The soak profile with 16 clients: every 200 is in the ledger, and every ledger row the
    clients did not see is explained by a reset after the charge or a slow answer they left."""
    import threading
    sb = sandbox_factory(key=KEY, balance=1000.0,
                         args=["--faults", str(CONFIGS / "faults-soak.yaml"), "--slow-s", "3"])
    seen, lost, lock = set(), set(), threading.Lock()

    def worker(t: int) -> None:
        with requests.Session() as s:
            for i in range(150):
                rid = f"soak-{t}-{i}"
                try:
                    r = _embed(sb, s, rid, timeout=(5, 1.5))
                except (requests.ConnectionError, requests.Timeout):
                    with lock:
                        lost.add(rid)
                    continue
                if r.status_code == 200:
                    with lock:
                        seen.add(rid)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(16)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    ledger_ids = {row["request_id"] for row in sb.ledger()}
    injected = _injected(sb)
    assert seen <= ledger_ids
    billed_unseen = ledger_ids - seen
    assert billed_unseen <= lost
    assert len(billed_unseen) == injected["reset_after_charge"] + injected["slow"]
    print(f"\nsoak: {len(seen)} answered, {len(lost)} lost, {len(billed_unseen)} billed unseen, {injected}")

"""Account-wide caps per day and per 31 days against the sandbox, while a second key of the SAME
account spends during the run: the job stops when the room under the cap is used, its own
overshoot stays within max-in-flight x workers x the largest request's cost, the service's
day turning over frees the new day's room, and a 429 from the statistics endpoint is never
fatal. The overshoot each test sees is printed (pytest -s)."""
from __future__ import annotations

import collections
import datetime as dt
import json
import threading

import pytest
import requests

from pipeline.cli import main
from service.credentials import key_fingerprint
from service.sandbox.store import Charge, Store
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, current, ledger, micro,
                                     run, summary, write_corpus, write_models)

JOB_KEY, OTHER_KEY = "sk-caps-job", "sk-caps-other"
MAX_IN_FLIGHT = 4
OTHER_REQUEST = " ".join(["budget"] * 200)   # 200 tokens: 0.02 RUB at the test price
DAY_S = 86_400


@pytest.fixture
def setup(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", JOB_KEY)
    rows = corpus_rows()   # about 2.1 RUB at the test price
    accounts = tmp_path / "accounts.yaml"
    accounts.write_text(f"accounts:\n  shared:\n    balance: 100.0\n    keys:\n"
                        f"      - key: {JOB_KEY}\n      - key: {OTHER_KEY}\n", encoding="utf-8")
    settings = tmp_path / "run.yaml"
    settings.write_text("budget: {balance_poll_s: 0.5}\n", encoding="utf-8")   # under 5 calls/s
    return rows, write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml"), \
        accounts, settings, tmp_path / "clock"


def start(sandbox_factory, setup, db=None, *args):
    _, _, models, accounts, _, clock = setup
    # job requests (~1000 tokens) take ~0.3 s, so other clients' requests land between them
    return sandbox_factory(db=db, key=None, args=["--models", models, "--accounts", accounts, "--clock-file",
                                                  clock, "--latency-per-token-us", "300", *args])


def job(sb, setup, out, *flags, settings=None):
    _, corpus, models, _, default_settings, _ = setup
    return run(corpus, out, sb, models, "--run-config", str(settings or default_settings),
               "--max-in-flight", str(MAX_IN_FLIGHT), *flags)


def plan(sb, setup, capsys, *flags) -> tuple[int, dict]:
    _, corpus, models, _, settings, _ = setup
    code = main(["plan", "--input", str(corpus), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--run-config", str(settings), "--json", *flags])
    return code, json.loads(capsys.readouterr().out)


def spend(sb, rub: float) -> float:
    """The other key spends about RUB in 0.02 RUB requests; returns what it was billed."""
    spent = 0.0
    while spent < rub - 1e-9:
        r = requests.post(sb.base_url + "/embeddings", headers={"Authorization": f"Bearer {OTHER_KEY}"},
                          json={"model": MODEL, "input": OTHER_REQUEST, "encoding_format": "base64"}, timeout=30)
        r.raise_for_status()
        spent += r.json()["usage"]["cost_rub"]
    return spent


def job_charges(sb) -> list[dict]:
    return [c for c in ledger(sb) if c["key_id"] == key_fingerprint(JOB_KEY)]


class WhileTheJobRuns(threading.Thread):
    """Once the job's first charge is in the ledger: optionally turn the service's day over,
    then let the other key spend RUB."""

    def __init__(self, sb, rub: float, clock=None):
        super().__init__(daemon=True)
        self.sb, self.rub, self.clock, self.done = sb, rub, clock, threading.Event()
        self.stop = threading.Event()

    def run(self):
        while not job_charges(self.sb):
            if self.stop.wait(0.01):
                return
        if self.clock is not None:
            self.clock.write_text(str(DAY_S), encoding="utf-8")
        spend(self.sb, self.rub)
        self.done.set()

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.join(60)


def overshoot(charges: list[dict], cap_rub: float, window=lambda c: c["created_at"][:10],
              workers: int = 1) -> tuple[int, int]:
    """(the job's spending above the cap, the stated bound), micro-RUB. The account's usage is
    summed in charge order per WINDOW (the service's day, UTC here); a job charge counts for
    the part of it that lies above the cap, whoever brought the usage there."""
    cap, used, over = round(cap_rub * 1e6), collections.Counter(), 0
    for c in charges:
        before = used[window(c)]
        used[window(c)] += round(c["cost_rub"] * 1e6)
        if c["key_id"] == key_fingerprint(JOB_KEY):
            over += max(0, used[window(c)] - max(before, cap))
    mine = [round(c["cost_rub"] * 1e6) for c in charges if c["key_id"] == key_fingerprint(JOB_KEY)]
    return over, MAX_IN_FLIGHT * workers * max(mine)


def usage(charges, day: str | None = None) -> int:
    return micro(c["cost_rub"] for c in charges if day is None or c["created_at"].startswith(day))


def after_the_job(charges, day: str | None = None) -> int:
    """The usage when the job's last charge was made (the other client may spend on after it)."""
    last = max(i for i, c in enumerate(charges) if c["key_id"] == key_fingerprint(JOB_KEY))
    return usage(charges[:last + 1], day)


def interleaved(charges) -> bool:
    """Another client's charge lies between the job's first and last."""
    mine = [i for i, c in enumerate(charges) if c["key_id"] == key_fingerprint(JOB_KEY)]
    return any(c["key_id"] != key_fingerprint(JOB_KEY) for c in charges[mine[0]:mine[-1]])


def test_daily_cap_holds_while_another_key_spends_and_resumes_on_the_next_day(tmp_path, sandbox_factory, setup,
                                                                               capsys):
    rows = setup[0]
    cap = 1.0
    sb = start(sandbox_factory, setup)
    spend(sb, 0.2)
    code, p = plan(sb, setup, capsys, "--daily-cap-rub", str(cap), "--max-spend-rub", "10")
    assert code == 3 and p["binding_limit"] == "daily_cap_rub" and p["daily_cap_rub"] == cap
    assert p["monthly_cap_rub"] is None and p["spendable_rub"] == pytest.approx(cap - p["stats"]["daily_usage"])

    out = tmp_path / "out"
    # statistics read only at the start and before giving up: the other key's spending shows
    # to the job only through the balance in its own responses
    rarely = tmp_path / "rarely.yaml"
    rarely.write_text("budget: {balance_poll_s: 600}\n", encoding="utf-8")
    with WhileTheJobRuns(sb, 0.3) as other:
        assert job(sb, setup, out, "--daily-cap-rub", str(cap), "--max-spend-rub", "10", "--allow-partial",
                   settings=rarely) == 4
    charges = ledger(sb)
    assert other.done.is_set() and interleaved(charges)
    over, bound = overshoot(charges, cap)
    print(f"\ndaily cap {cap} RUB: account used {usage(charges) / 1e6} RUB, the job's overshoot {over} µRUB, "
          f"bound {bound} µRUB ({len(job_charges(sb))} job requests)")
    assert over <= bound
    assert usage(charges) >= round(cap * 1e6 * 0.8)     # the room was used, not abandoned early
    s = summary(out)
    assert s["caps"] == {"daily_cap_rub": cap, "monthly_cap_rub": None, "binding_limit": "daily_cap_rub"}
    assert s["estimate"]["spendable_rub"] == pytest.approx(p["spendable_rub"])   # plan and run agree
    assert s["stats_before"]["daily_usage"] == pytest.approx(0.2, abs=0.01)
    assert after_the_job(charges) <= round(s["stats_after"]["daily_usage"] * 1e6) <= usage(charges)
    assert set(current(out, "pending").column("reason").to_pylist()) == {"budget_exhausted"}

    (setup[5]).write_text(str(DAY_S), encoding="utf-8")     # the service's next day
    first_day = charges
    code = job(sb, setup, out, "--daily-cap-rub", str(cap), "--resume", "--allow-partial")
    assert code in (0, 4)
    charges = ledger(sb)
    assert len(charges) > len(first_day) and billed_twice(job_charges(sb)) == {}
    over, bound = overshoot(charges, cap)
    assert over <= bound
    assert_every_row_once(out, rows)


@pytest.mark.soak   # slow: make soak
def test_two_worker_processes_hold_a_daily_cap_within_the_bound(tmp_path, sandbox_factory, setup):
    cap = 1.0
    sb = start(sandbox_factory, setup)
    out = tmp_path / "out"
    with WhileTheJobRuns(sb, 0.3) as other:
        assert job(sb, setup, out, "--daily-cap-rub", str(cap), "--allow-partial", "--direct_num_workers", "2",
                   "--direct_running_mode", "multi_processing") == 4
    charges = ledger(sb)
    assert other.done.is_set()
    over, bound = overshoot(charges, cap, workers=2)
    print(f"\ntwo workers, daily cap {cap} RUB: the job's overshoot {over} µRUB, bound {bound} µRUB")
    assert over <= bound and after_the_job(charges) >= round(cap * 1e6 * 0.8)
    assert_every_row_once(out, setup[0])


def test_day_boundary_during_a_run_frees_the_new_day_room_without_counting_twice(tmp_path, sandbox_factory, setup):
    cap = 1.0
    sb = start(sandbox_factory, setup)
    spend(sb, 0.7)                       # the old day: 0.3 RUB of room left when the job starts
    day1 = ledger(sb)[0]["created_at"][:10]
    out = tmp_path / "out"
    with WhileTheJobRuns(sb, 0.4, clock=setup[5]) as other:    # the new day: 0.4 RUB by another client
        assert job(sb, setup, out, "--daily-cap-rub", str(cap), "--allow-partial") == 4
    assert other.done.is_set()
    charges = ledger(sb)
    day2 = charges[-1]["created_at"][:10]
    mine_day2 = usage([c for c in charges if c["key_id"] == key_fingerprint(JOB_KEY)], day2)
    over, bound = overshoot(charges, cap)
    print(f"\nday boundary: old day {usage(charges, day1) / 1e6} RUB, new day {usage(charges, day2) / 1e6} RUB "
          f"(the job {mine_day2 / 1e6}), the job's overshoot {over} µRUB, bound {bound} µRUB")
    assert day2 > day1
    # counted twice, the old day's 0.7 RUB plus the new day's 0.4 would leave no room at all
    assert mine_day2 > round((cap - 0.7) * 1e6)
    assert over <= bound
    assert after_the_job(charges, day2) <= round(cap * 1e6) + bound
    s = summary(out)
    assert s["stats_before"]["daily_usage"] == pytest.approx(0.7, abs=0.01)
    assert after_the_job(charges, day2) <= round(s["stats_after"]["daily_usage"] * 1e6) <= usage(charges, day2)


def _spent_days_ago(db, days: int, rub: float) -> None:
    """The other key's spending DAYS ago, written straight into the sandbox's ledger."""
    when = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    store = Store(str(db), clock=lambda: when)
    store.ensure_account("shared", 100_000_000)
    store.ensure_key(key_fingerprint(OTHER_KEY), "shared", None)
    assert store.charge(Charge("past", key_fingerprint(OTHER_KEY), MODEL, 1, 1, round(rub * 1e6), ["00"])).ok
    store.close()


def test_monthly_cap_counts_earlier_days_and_refuses_before_sending(tmp_path, sandbox_factory, setup, capsys):
    rows = setup[0]
    cap = 1.2
    db = tmp_path / "sb" / "sandbox.db"
    db.parent.mkdir()
    _spent_days_ago(db, 10, 0.7)
    sb = start(sandbox_factory, setup, db)
    flags = ("--monthly-cap-rub", str(cap), "--daily-cap-rub", "5")
    code, p = plan(sb, setup, capsys, *flags)
    assert p["stats"] == {"daily_usage": 0.0, "monthly_usage": 0.7}
    assert code == 3 and p["binding_limit"] == "monthly_cap_rub" and p["spendable_rub"] == pytest.approx(0.5)
    _, corpus, models, _, settings, _ = setup
    assert main(["plan", "--input", str(corpus), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--run-config", str(settings), *flags]) == 3
    table = capsys.readouterr().out
    assert "5.0 (the account spent 0.0)" in table and "1.2 (the account spent 0.7)" in table
    assert "0.500000 (monthly_cap_rub binds)" in table

    refused = tmp_path / "refused"
    assert job(sb, setup, refused, *flags) == 3
    assert job_charges(sb) == []
    assert set(current(refused, "pending").column("reason").to_pylist()) == {"estimate_exceeds_budget"}
    assert_every_row_once(refused, rows)

    out = tmp_path / "out"
    with WhileTheJobRuns(sb, 0.2) as other:
        assert job(sb, setup, out, *flags, "--allow-partial") == 4
    charges = ledger(sb)
    assert other.done.is_set() and interleaved(charges)
    over, bound = overshoot(charges, cap, window=lambda c: "31 days")
    print(f"\nmonthly cap {cap} RUB: account used {usage(charges) / 1e6} RUB in 31 days, the job's overshoot "
          f"{over} µRUB, bound {bound} µRUB")
    assert over <= bound and usage(charges) >= round(cap * 1e6 * 0.8)
    s = summary(out)
    assert s["caps"] == {"daily_cap_rub": 5.0, "monthly_cap_rub": cap, "binding_limit": "monthly_cap_rub"}
    assert s["stats_before"]["monthly_usage"] == 0.7
    assert after_the_job(charges) <= round(s["stats_after"]["monthly_usage"] * 1e6) <= usage(charges)


@pytest.mark.soak   # slow: make soak
def test_a_429_from_stats_is_never_fatal(tmp_path, sandbox_factory, setup):
    """One account call a second, two at most at once: the job's readings are refused often."""
    cap = 1.0
    sb = start(sandbox_factory, setup, None, "--account-rps", "1", "--account-burst", "2")
    out = tmp_path / "out"
    with WhileTheJobRuns(sb, 0.3) as other:
        assert job(sb, setup, out, "--daily-cap-rub", str(cap), "--allow-partial") == 4
    assert other.done.is_set()
    with open(sb.log_path, encoding="utf-8") as fh:
        refused = sum("/service/stats -> 429" in line for line in fh)
    charges = ledger(sb)
    over, bound = overshoot(charges, cap)
    print(f"\n429s from stats: {refused}; the job's overshoot {over} µRUB, bound {bound} µRUB")
    assert refused > 0
    assert over <= bound and usage(charges) >= round(cap * 1e6 * 0.8)
    assert summary(out)["stats_after"] is not None


@pytest.mark.parametrize("flag", ["--daily-cap-rub", "--monthly-cap-rub"])
@pytest.mark.parametrize("value", ["nan", "-1", "inf"])
def test_a_bad_cap_is_a_usage_error(tmp_path, setup, flag, value):
    _, corpus, models, *_ = setup
    assert main(["plan", "--input", str(corpus), "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1",
                 "--models-config", str(models), flag, value]) == 2

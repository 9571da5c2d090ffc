"""Account-wide caps: the spendable arithmetic, the guard's usage estimate between statistics
readings (other clients' spending, the service's day turning over), and the rate-limited
reader. No HTTP, no Beam."""
from __future__ import annotations

import pickle

import pytest

from pipeline.money.account import Account, spendable
from pipeline.settings.config import parse_settings
from service import errors
from service.catalog import ConfigError
from service.client import Balance, Stats
from transforms.money.budget import Budget
from transforms.money.caps import DAILY_CAP, MAX_SPEND, MONTHLY_CAP, AccountReading, AccountWatch, Caps, Spendable

PRICE = 1e-6  # RUB per token: a token costs one micro-rouble


def _account(balance=100.0, budget=None, daily=0.0, monthly=0.0):
    return Account(balance, budget, {"daily_usage": daily, "monthly_usage": monthly})


def test_spendable_is_the_least_limit_and_names_it():
    s = spendable(_account(daily=2.5, monthly=40.0), 0.0, 10.0, Caps(daily_cap_rub=3.0, monthly_cap_rub=50.0))
    assert s.rub == 0.5 and s.binding == DAILY_CAP
    assert s.limits == {"balance": 100.0, MAX_SPEND: 10.0, DAILY_CAP: 0.5, MONTHLY_CAP: 10.0}
    s = spendable(_account(daily=2.5, monthly=49.9), 0.0, None, Caps(daily_cap_rub=3.0, monthly_cap_rub=50.0))
    assert s.binding == MONTHLY_CAP and s.rub == pytest.approx(0.1)
    assert spendable(_account(), 0.0, 10.0).binding == MAX_SPEND


def test_other_clients_already_over_a_cap_leave_zero_not_less():
    s = spendable(_account(daily=7.0), 0.0, None, Caps(daily_cap_rub=5.0))
    assert s.rub == 0.0 and s.binding == DAILY_CAP


def test_caps_need_the_statistics():
    with pytest.raises(ValueError):
        spendable(Account(100.0, None, None), 0.0, None, Caps(daily_cap_rub=1.0))


def test_the_breakdown_survives_pickling_to_the_workers():
    s = spendable(_account(daily=1.0), 0.0, 10.0, Caps(daily_cap_rub=3.0))
    back = pickle.loads(pickle.dumps(Budget(100.0, s, PRICE, 1.0, 1.0, 5.0)))
    assert back.spendable == s and back.spendable.limits == s.limits and back.has_caps
    assert back.spendable.without_caps == 10.0 and [c.name for c in s.cap_usages(100.0)] == [DAILY_CAP]
    plain = Budget(100.0, spendable(_account(), 0.0, 2.0), PRICE, 1.0, 1.0, 5.0)
    assert not plain.has_caps and plain.guard(None).limited and plain.spendable.cap_usages(100.0) == []


def test_caps_in_the_settings_file():
    budget = parse_settings("budget: {daily_cap_rub: 300, monthly_cap_rub: null}").budget
    assert budget.daily_cap_rub == 300.0 and budget.monthly_cap_rub is None
    for bad in ("-1", ".inf", ".nan", "'300'"):
        with pytest.raises(ConfigError):
            parse_settings(f"budget: {{daily_cap_rub: {bad}}}")


def _guard(daily_cap=1.0, daily=0.0, balance=100.0, read=None, spendable_rub=50.0):
    s = Spendable({"balance": balance, MAX_SPEND: spendable_rub, DAILY_CAP: max(daily_cap - daily, 0)},
                  Caps(daily_cap_rub=daily_cap), {"daily_usage": daily, "monthly_usage": daily})
    return Budget(balance, s, PRICE, margin=1.0, learned_margin=1.0, poll_s=5.0).guard(read)


def test_the_room_under_a_cap_starts_from_the_account_usage():
    g = _guard(daily_cap=1.0, daily=0.6)
    assert g.reserve_prefix([300_000, 200_000]) == (1, 300_000)
    assert g.exhausted


def test_other_clients_spending_shows_through_the_balance_in_each_response():
    g = _guard(daily_cap=1.0)
    n, r = g.reserve_prefix([100_000])
    g.settle(r, cost_rub=0.1, balance_after=99.3)   # ours 0.1, another client's 0.6
    assert g.reserve_prefix([300_000, 1]) == (1, 300_000)  # 0.3 RUB were left under the cap


def test_the_new_day_room_is_used_without_counting_yesterday_twice():
    readings = []
    g = _guard(daily_cap=1.0, daily=0.5, read=lambda force: readings.pop(0) if readings else None)
    n, r = g.reserve_prefix([400_000])
    g.settle(r, cost_rub=0.4, balance_after=99.6)
    # the service's day turns over: daily_usage falls back to what was spent since midnight
    readings.append(AccountReading(99.5, None, {"daily_usage": 0.1, "monthly_usage": 1.0}))
    g.poll()
    assert g.reserve_prefix([900_000, 1]) == (1, 900_000)


def test_a_reading_asked_for_earlier_never_replaces_a_later_one():
    stale = AccountReading(100.0, None, {"daily_usage": 0.0, "monthly_usage": 0.0})
    fresh = AccountReading(99.2, None, {"daily_usage": 0.8, "monthly_usage": 0.8})
    asked = []

    def read(force):  # the first reading's answer arrives after a second one was applied
        asked.append(force)
        if len(asked) == 1:
            g.poll()
            return stale
        return fresh

    g = _guard(daily_cap=1.0, daily=0.0, read=read)
    g.poll()
    assert g.reserve_prefix([300_000])[0] == 0


def test_a_cap_shortfall_asks_for_one_fresh_reading_before_giving_up():
    asked = []

    def read(force):
        asked.append(force)
        return AccountReading(99.0, None, {"daily_usage": 0.0, "monthly_usage": 1.0})  # a new day

    g = _guard(daily_cap=1.0, daily=0.9, read=read)
    assert g.reserve_prefix([500_000]) == (1, 500_000)
    assert asked == [True] and not g.exhausted


def test_when_the_fresh_reading_does_not_help_the_guard_gives_up_once():
    asked = []
    g = _guard(daily_cap=1.0, daily=0.9, read=lambda force: asked.append(force))
    assert g.reserve_prefix([500_000]) == (0, 0)
    assert g.exhausted and asked == [True]
    assert g.reserve_prefix([1]) == (0, 0) and asked == [True]


def test_a_run_limit_shortfall_needs_no_reading():
    asked = []
    g = _guard(daily_cap=10.0, spendable_rub=0.1, read=lambda force: asked.append(force))
    assert g.reserve_prefix([200_000]) == (0, 0)
    assert asked == []


class FakeClient:
    def __init__(self):
        self.calls, self.refuse = [], {}

    def _answer(self, what, value):
        self.calls.append(what)
        if what in self.refuse:
            raise self.refuse.pop(what)
        return value

    def balance(self):
        return self._answer("balance", Balance(99.0, None))

    def stats(self):
        return self._answer("stats", Stats(0.5, 2.0))


class FakeClock:
    def __init__(self):
        self.now, self.slept = 0.0, []

    def __call__(self):
        return self.now

    def sleep(self, s):
        self.slept.append(s)
        self.now += s


def _watch(with_stats=True):
    client, clock = FakeClient(), FakeClock()
    return AccountWatch(client, 5.0, with_stats, clock=clock, sleep=clock.sleep), client, clock


def test_the_watch_reads_balance_then_stats_at_most_every_interval():
    w, client, clock = _watch()
    assert w.read() == AccountReading(99.0, None, {"daily_usage": 0.5, "monthly_usage": 2.0})
    assert client.calls == ["balance", "stats"]
    clock.now = 4.9
    assert w.read() is None and len(client.calls) == 2
    clock.now = 5.0
    assert w.read() is not None
    w_plain, client, _ = _watch(with_stats=False)
    assert w_plain.read().stats is None and client.calls == ["balance"]


def test_a_429_from_stats_keeps_the_last_figures_and_waits_its_retry_after():
    w, client, clock = _watch()
    client.refuse["stats"] = errors.RateLimitError("slow down", retry_after=12.0)
    reading = w.read()
    assert reading.balance == 99.0 and reading.stats is None and w.throttled == 1
    clock.now = 6.0          # the interval has passed, the Retry-After has not
    assert w.read() is None
    clock.now = 12.0
    assert w.read().stats is not None


def test_a_forced_reading_waits_out_a_short_retry_after_and_never_raises():
    w, client, clock = _watch()
    client.refuse["balance"] = errors.RateLimitError("slow down", retry_after=2.0)
    assert w.read() is None
    assert w.read(force=True) is not None and clock.slept == [2.0]
    client.refuse["balance"] = errors.RateLimitError("slow down", retry_after=3600.0)
    assert w.read(force=True) is None          # far away: give up with the last figures
    client.refuse["balance"] = errors.APIConnectionError("down")
    clock.now = 10_000.0
    assert w.read(force=True) is None

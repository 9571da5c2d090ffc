"""The budget guard's arithmetic and waiting, without HTTP or Beam."""
from __future__ import annotations

import threading

from transforms.money.budget import BudgetGuard, worst_case_micro

PRICE = 2e-6  # RUB per token


def _guard(spendable=1.0, margin=1.0, **kw):
    return BudgetGuard(balance_before=100.0, spendable_rub=spendable, price_per_token_rub=PRICE,
                       margin=margin, **kw)


def test_unlimited_guard_never_refuses():
    g = BudgetGuard(balance_before=None, spendable_rub=None, price_per_token_rub=PRICE, margin=1.0)
    assert g.reserve_prefix([10**9, 10**9]) == (2, worst_case_micro(2 * 10**9, PRICE, 1.0))


def test_the_longest_fitting_prefix_is_reserved_and_the_guard_latches():
    g = _guard()
    assert g.reserve_prefix([200_000, 200_000, 200_000]) == (2, 800_000)
    assert g.exhausted
    assert g.reserve_prefix([1]) == (0, 0)


def test_service_balance_is_the_shared_counter():
    # another worker spent 0.9 RUB: only this worker's response tells us, through usage.balance
    g = _guard()
    n, r = g.reserve_prefix([1000])
    g.settle(r, cost_rub=0.002, balance_after=99.098)
    assert g.reserve_prefix([49_000, 1]) == (1, 98_000)  # 0.098 RUB were left


def test_key_budget_from_the_balance_endpoint_limits_too():
    g = _guard(spendable=50.0)
    g.observe_account(balance=100.0, key_budget=0.01)
    assert g.reserve_prefix([5_000, 1])[0] == 1


def test_price_margin_applies_until_a_response_shows_the_price():
    g = _guard(margin=1.25, learned_margin=1.0)
    assert g.worst_case(1000) == 2500
    g.learn_price(cost_rub=0.002, total_tokens=1000)  # the estimate was right
    assert g.worst_case(1000) == 2000
    g.learn_price(cost_rub=0.006, total_tokens=1000)  # the service bills more: 4e-6 on average
    assert g.worst_case(1000) == 4000


def test_a_cheaper_bill_never_lowers_the_worst_case():
    g = _guard(margin=1.0)
    g.learn_price(cost_rub=0.001, total_tokens=1000)
    assert g.worst_case(1000) == 2000


def test_a_failed_request_releases_its_reservation():
    g = _guard(spendable=0.001)
    n, r = g.reserve_prefix([500])
    assert n == 1
    g.settle(r, cost_rub=None, balance_after=None)
    assert g.reserve_prefix([500]) == (1, 1000)


def test_a_request_waits_for_reservations_in_flight_before_giving_up():
    """With 1.25x reservations in flight the last request would not fit; once they settle at
    their real cost it does. Waiting, not latching, is what keeps a cap the preflight accepted."""
    g = _guard(spendable=0.004, margin=1.25, learned_margin=1.0)  # room for exactly 2000 tokens
    n, first = g.reserve_prefix([1000])
    assert (n, first) == (1, 2500)
    result = {}
    waiter = threading.Thread(target=lambda: result.setdefault("r", g.reserve_prefix([1000])))
    waiter.start()
    waiter.join(0.2)
    assert waiter.is_alive()  # 2500 + 2500 > 4000: it waits for the first to settle
    g.learn_price(cost_rub=0.002, total_tokens=1000)
    g.settle(first, cost_rub=0.002, balance_after=99.998)
    waiter.join(5)
    assert result["r"] == (1, 2000) and not g.exhausted


def test_an_attempt_without_an_answer_counts_as_spent_at_its_worst_case_until_the_balance_shows_it():
    """A timed-out attempt may be billed after any balance read so far: freeing its reservation
    let the next request take the room (a 1.0 RUB cap, 1.6 RUB spent in one process)."""
    g = _guard(spendable=1.0)
    n, r = g.reserve_prefix([200_000])            # 0.4 RUB at worst
    g.settle(r, cost_rub=None, balance_after=None, unanswered=1)   # timed out: no answer
    assert g.reserve_prefix([100_000, 100_000, 100_000, 1]) == (3, 600_000)   # 0.6 left, not 1.0
    g.settle(600_000, cost_rub=0.6, balance_after=99.4)   # the balance shows the 0.6, not the 0.4 yet
    assert g.reserve_prefix([1])[0] == 0


def test_attempts_without_an_answer_count_on_top_of_what_the_balance_shows():
    """The balance falls by every charge to the account: what it shows fallen may be another
    worker's spending, while this worker's attempt is still to be billed. The two add up."""
    g = _guard(spendable=1.0)
    n, r = g.reserve_prefix([200_000])
    g.settle(r, cost_rub=None, balance_after=None, unanswered=1)   # 0.4 at worst
    g.observe_account(balance=99.5, key_budget=None)               # 0.5 spent by others (or 0.4 of it ours)
    assert g.reserve_prefix([50_000, 1]) == (1, 100_000)            # 1.0 - 0.5 - 0.4


def test_the_retry_of_an_attempt_without_an_answer_goes_only_while_the_budget_holds_it():
    g = _guard(spendable=1.0)
    n, r = g.reserve_prefix([200_000])   # 0.4 at worst: the attempt and its retry fit in 1.0
    assert g.unanswered(r)
    assert not g.unanswered(r)           # a third 0.4 does not
    g.settle(r, cost_rub=None, balance_after=None)
    assert g.reserve_prefix([100_000, 1]) == (1, 200_000)   # 0.8 counted, 0.2 left


def test_a_cap_counts_attempts_without_an_answer_too():
    from transforms.money.caps import DAILY_CAP, CapUsage
    g = _guard(spendable=50.0, caps=[CapUsage(DAILY_CAP, 1.0, 0.0, 100.0)])
    n, r = g.reserve_prefix([200_000])
    g.settle(r, cost_rub=None, balance_after=None, unanswered=1)
    assert g.reserve_prefix([150_000, 150_000, 1]) == (2, 600_000)   # 0.6 left under the cap


def test_a_cap_counts_attempts_without_an_answer_on_top_of_what_the_balance_fell_by():
    from transforms.money.caps import DAILY_CAP, CapUsage
    g = _guard(spendable=50.0, caps=[CapUsage(DAILY_CAP, 1.0, 0.0, 100.0)])
    n, r = g.reserve_prefix([200_000])
    g.settle(r, cost_rub=None, balance_after=None, unanswered=1)   # 0.4 at worst
    g.observe_account(balance=99.5, key_budget=None)               # others spent 0.5 meanwhile
    assert g.reserve_prefix([50_000, 1]) == (1, 100_000)            # 0.1 left under the cap

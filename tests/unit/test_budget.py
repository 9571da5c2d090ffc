"""The budget guard's arithmetic, without HTTP or Beam."""
from __future__ import annotations

import math

from transforms.budget import BudgetGuard

PRICE = 2e-6  # RUB per token


def test_unlimited_guard_never_refuses():
    g = BudgetGuard(balance_before=None, spendable_rub=None, price_per_token_rub=PRICE, margin=1.0)
    assert g.affordable_tokens() == math.inf
    assert g.reserve(10**9) is not None


def test_reservations_count_against_the_cap_until_settled():
    g = BudgetGuard(balance_before=100.0, spendable_rub=1.0, price_per_token_rub=PRICE, margin=1.0)
    assert g.affordable_tokens() == 500_000
    r1 = g.reserve(300_000)
    assert r1 == 600_000  # micro-roubles
    assert g.reserve(300_000) is None and g.exhausted


def test_service_balance_is_the_shared_counter():
    # another worker spent 0.9 RUB: only this worker's response tells us, through usage.balance
    g = BudgetGuard(balance_before=100.0, spendable_rub=1.0, price_per_token_rub=PRICE, margin=1.0)
    r = g.reserve(1000)
    g.settle(r, cost_rub=0.002, balance_after=99.098)
    assert g.affordable_tokens() == 49_000  # 1.0 - 0.902 = 0.098 RUB left


def test_key_budget_from_the_balance_endpoint_limits_too():
    g = BudgetGuard(balance_before=100.0, spendable_rub=50.0, price_per_token_rub=PRICE, margin=1.0)
    g.observe_account(balance=100.0, key_budget=0.01)
    assert g.affordable_tokens() == 5_000


def test_margin_and_learned_price_make_reservations_conservative():
    g = BudgetGuard(balance_before=10.0, spendable_rub=1.0, price_per_token_rub=PRICE, margin=1.25)
    assert g.worst_case(1000) == 2500
    g.learn_price(cost_rub=0.004, total_tokens=1000)  # the service bills 4e-6 per token
    assert g.worst_case(1000) == 5000
    g.learn_price(cost_rub=0.001, total_tokens=1000)  # a cheaper answer never lowers it
    assert g.worst_case(1000) == 5000


def test_failed_request_releases_its_reservation():
    g = BudgetGuard(balance_before=10.0, spendable_rub=0.001, price_per_token_rub=PRICE, margin=1.0)
    r = g.reserve(500)
    assert g.affordable_tokens() == 0
    g.settle(r, cost_rub=None, balance_after=None)
    assert g.affordable_tokens() == 500

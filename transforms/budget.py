"""The in-run budget guard: reserve a request's worst-case cost before it is sent.

Workers share no coordinator. The account balance that every embeddings response carries
(`usage.balance`) is the shared counter: each worker's view of what the run has spent is
`balance_before - lowest balance seen`, plus its own requests still in flight. A worker
cannot see the other workers' in-flight requests, so the run can overshoot its cap by at
most (in-flight requests per worker x workers x the largest request's cost). All money is
held in integer micro-roubles (1e-6 RUB), the service's billing precision.

The worst case of a request is tokens x price x margin. Until a response has shown the real
price, the margin covers a wrong price estimate too (`margin`); afterwards only the client's
token count can be off (`learned_margin`, 1 / the model's safety factor). The preflight uses
the same arithmetic (`worst_case_micro`), so a cap it accepts is not refused partway.
"""
from __future__ import annotations

import math
import threading
from typing import Sequence

from transforms.apportion import to_micro


# A learned price this close to the estimate is the estimate, rounded per request.
PRICE_NOISE = 1e-3


def worst_case_micro(n_tokens: int, price_per_token_rub: float, margin: float) -> int:
    return math.ceil(n_tokens * price_per_token_rub * 1e6 * margin)


class BudgetGuard:
    def __init__(self, *, balance_before: float | None, spendable_rub: float | None,
                 price_per_token_rub: float, margin: float, learned_margin: float | None = None):
        self._cond = threading.Condition()
        self._before = None if balance_before is None else to_micro(balance_before)
        self._cap = None if spendable_rub is None else max(0, to_micro(spendable_rub))
        self._price = self._estimate = price_per_token_rub
        self._billed_micro = self._billed_tokens = 0
        self._margin = margin
        self._learned_margin = margin if learned_margin is None else learned_margin
        self._lowest_balance = self._before
        self._key_budget = None
        self._settled = 0
        self._in_flight = 0
        self.exhausted = False
        self.stop_reason: str | None = None  # why stop() was called; None when the cap was reached

    @property
    def limited(self) -> bool:
        return self._cap is not None

    def worst_case(self, n_tokens: int) -> int:
        return worst_case_micro(n_tokens, self._price, self._margin)

    def _spent(self) -> int:
        seen = 0 if self._before is None or self._lowest_balance is None else self._before - self._lowest_balance
        return max(seen, self._settled)

    def _room(self) -> float:
        room = math.inf if self._cap is None else self._cap - self._spent() - self._in_flight
        if self._key_budget is not None:
            room = min(room, self._key_budget - self._in_flight)
        return room

    def reserve_prefix(self, token_counts: Sequence[int]) -> tuple[int, int]:
        """Reserve the worst case of the longest prefix of TOKEN_COUNTS that fits: (items,
        reservation). While requests are in flight whose settling may make room for all of
        them, wait; when even then not all fit, the guard latches exhausted (the caller sends
        the prefix, a smaller request, and marks the rest pending)."""
        with self._cond:
            total = self.worst_case(sum(token_counts))
            while not self.exhausted and self._in_flight and total > self._room():
                self._cond.wait()
                total = self.worst_case(sum(token_counts))
            if self.exhausted:
                return 0, 0
            room, n, tokens, need = self._room(), 0, 0, 0
            while n < len(token_counts) and self.worst_case(tokens + token_counts[n]) <= room:
                tokens += token_counts[n]
                n += 1
            need = self.worst_case(tokens) if n else 0
            if n < len(token_counts):
                self.exhausted = True
                self._cond.notify_all()
            self._in_flight += need
            return n, need

    def settle(self, reservation: int, cost_rub: float | None, balance_after: float | None) -> None:
        """A response came back (cost known) or the request failed (cost None: nothing billed)."""
        with self._cond:
            self._in_flight -= reservation
            if cost_rub is not None:
                self._settled += to_micro(cost_rub)
                if self._key_budget is not None:
                    self._key_budget -= to_micro(cost_rub)
            self._observe_balance(balance_after)
            self._cond.notify_all()

    def learn_price(self, cost_rub: float, total_tokens: int) -> None:
        """Responses show the effective price (averaged: each request's cost is rounded to the
        micro-rouble). The worst case follows a price above the estimate, never one below it,
        and the price margin is no longer needed."""
        if total_tokens > 0:
            with self._cond:
                self._billed_micro += to_micro(cost_rub)
                self._billed_tokens += total_tokens
                learned = self._billed_micro / 1e6 / self._billed_tokens
                if learned > self._estimate * (1 + PRICE_NOISE):
                    self._price = learned
                self._margin = self._learned_margin

    def observe_account(self, balance: float | None, key_budget: float | None) -> None:
        """Fresh numbers from the (rate-limited) balance endpoint."""
        with self._cond:
            self._observe_balance(balance)
            if key_budget is not None:
                self._key_budget = to_micro(key_budget)
            self._cond.notify_all()  # a larger budget may let a waiting request go

    def _observe_balance(self, balance: float | None) -> None:
        if balance is not None and self._before is not None:
            micro = to_micro(balance)
            self._lowest_balance = micro if self._lowest_balance is None else min(self._lowest_balance, micro)

    def stop(self, reason: str) -> None:
        """Stop spending for REASON (a 402, say): what is not sent yet is pending for it."""
        with self._cond:
            if not self.exhausted:
                self.exhausted, self.stop_reason = True, reason
            self._cond.notify_all()

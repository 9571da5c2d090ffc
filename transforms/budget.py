"""The in-run budget guard: reserve a request's worst-case cost before it is sent.

Workers share no coordinator. The account balance that every embeddings response carries
(`usage.balance`) is the shared counter: each worker's view of what the run has spent is
`balance_before - lowest balance seen`, plus its own requests still in flight. A worker
cannot see the other workers' in-flight requests, so the run can overshoot its cap by at
most (in-flight requests per worker x workers x the largest request's cost). All money is
held in integer micro-roubles (1e-6 RUB), the service's billing precision.
"""
from __future__ import annotations

import math
import threading

from transforms.apportion import to_micro


class BudgetGuard:
    def __init__(self, *, balance_before: float | None, spendable_rub: float | None,
                 price_per_token_rub: float, margin: float):
        self._lock = threading.Lock()
        self._before = None if balance_before is None else to_micro(balance_before)
        self._cap = None if spendable_rub is None else max(0, to_micro(spendable_rub))
        self._price = price_per_token_rub * 1e6  # micro-roubles per token
        self._margin = margin
        self._lowest_balance = self._before
        self._key_budget = None
        self._settled = 0
        self._in_flight = 0
        self.exhausted = False

    @property
    def limited(self) -> bool:
        return self._cap is not None

    def worst_case(self, n_tokens: int) -> int:
        return math.ceil(n_tokens * self._price * self._margin)

    def _spent(self) -> int:
        seen = 0 if self._before is None or self._lowest_balance is None else self._before - self._lowest_balance
        return max(seen, self._settled)

    def _room(self) -> float:
        room = math.inf if self._cap is None else self._cap - self._spent() - self._in_flight
        if self._key_budget is not None:
            room = min(room, self._key_budget - self._in_flight)
        return room

    def affordable_tokens(self) -> int | float:
        """How many tokens the next request may carry now (inf when unlimited)."""
        with self._lock:
            room = self._room()
            if room == math.inf:
                return math.inf
            return 0 if self.exhausted or room <= 0 else math.floor(room / (self._price * self._margin or 1))

    def reserve(self, n_tokens: int) -> int | None:
        """Reserve the worst case of N tokens; None (and the guard latches exhausted) if it
        does not fit. The caller then sends a smaller request or marks the rest pending."""
        with self._lock:
            need = self.worst_case(n_tokens)
            if self.exhausted or need > self._room():
                self.exhausted = True
                return None
            self._in_flight += need
            return need

    def settle(self, reservation: int, cost_rub: float | None, balance_after: float | None) -> None:
        """A response came back (cost known) or the request failed (cost None: nothing billed)."""
        with self._lock:
            self._in_flight -= reservation
            if cost_rub is not None:
                self._settled += to_micro(cost_rub)
                if cost_rub and self._key_budget is not None:
                    self._key_budget -= to_micro(cost_rub)
            self._observe_balance(balance_after)

    def learn_price(self, cost_rub: float, total_tokens: int) -> None:
        """Take the effective price from a response when it is above the estimate."""
        if total_tokens > 0:
            with self._lock:
                self._price = max(self._price, to_micro(cost_rub) / total_tokens)

    def observe_account(self, balance: float | None, key_budget: float | None) -> None:
        """Fresh numbers from the (rate-limited) balance endpoint."""
        with self._lock:
            self._observe_balance(balance)
            if key_budget is not None:
                self._key_budget = to_micro(key_budget)

    def _observe_balance(self, balance: float | None) -> None:
        if balance is not None and self._before is not None:
            micro = to_micro(balance)
            self._lowest_balance = micro if self._lowest_balance is None else min(self._lowest_balance, micro)

    def stop(self) -> None:
        """Stop spending (a 402, or a request that did not fit)."""
        with self._lock:
            self.exhausted = True

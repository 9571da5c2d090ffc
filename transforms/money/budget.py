"""The in-run budget guard: reserve a request's worst-case cost before it is sent.

Workers share no coordinator. The account balance that every embeddings response carries
(`usage.balance`) is the shared counter: a worker counts as spent what the balance fell by
since the run began, plus its own requests in flight and its own attempts without an answer.
Money is held in integer micro-roubles (1e-6 RUB), the service's billing precision.

An attempt sent without an answer (a read timeout, a broken connection, a 5xx) may be billed
after any balance read since (the service bills work it finishes after the client left): it
counts at its request's worst case on top of what the balance shows, for the guard's life. No
reading can show it billed, as the balance falls by every charge to the account and this
worker's late charge looks like another's (one billed already counts twice: rows left pending
a little early under a cap, never more spent). Its retry goes only while the room holds it too.

The bound: a worker sends only what fits under the cap beside all it knows of, so a worker
alone never exceeds it. The run exceeds it by at most what the other workers are billed after
the last balance the last worker to send read: per other worker, its requests in flight (each
at most the largest request's worst case) and its attempts without an answer billed late
(tests/unit/test_budget_shared.py).

The worst case of a request is tokens x price x margin. Until a response has shown the real
price, the margin covers a wrong price estimate too (`margin`); afterwards only the client's
token count can be off (`learned_margin`, 1 / the model's safety factor). The preflight uses
the same arithmetic (`worst_case_micro`), so a cap it accepts is not refused partway.

Account-wide caps per day and per 31 days (transforms/money/caps.py) are limits of their own: the
room under each is estimated from the last statistics reading, which `poll` renews within
the endpoint's rate limit. A request that does not fit because of a cap asks for one fresh
reading before the guard gives up, since that room can grow (the service's day turned over).
"""
from __future__ import annotations

import dataclasses
import math
import threading
from collections.abc import Callable, Sequence

from transforms.money.apportion import to_micro
from transforms.money.caps import USAGE, AccountReading, CapUsage, Spendable
from transforms.pending import Pending

# A learned price this close to the estimate is the estimate, rounded per request.
PRICE_NOISE = 1e-3


def worst_case_micro(n_tokens: int, price_per_token_rub: float, margin: float) -> int:
    return math.ceil(n_tokens * price_per_token_rub * 1e6 * margin)


class BudgetGuard:
    def __init__(self, *, balance_before: float | None, spendable_rub: float | None,
                 price_per_token_rub: float, margin: float, learned_margin: float | None = None,
                 caps: Sequence[CapUsage] = (),
                 read_account: Callable[[bool], AccountReading | None] | None = None):
        self._cond = threading.Condition()
        self._caps, self._read_account = list(caps), read_account
        self._readings = self._applied = 0  # readings asked for / the latest one applied
        self._before = None if balance_before is None else to_micro(balance_before)
        self._cap = None if spendable_rub is None else max(0, to_micro(spendable_rub))
        self._price = self._estimate = price_per_token_rub
        self._billed_micro = self._billed_tokens = 0
        self._margin = margin
        self._learned_margin = margin if learned_margin is None else learned_margin
        self._lowest_balance = self._before
        self._key_budget: int | None = None
        self._settled = 0
        self._unanswered = 0   # worst cases of attempts that may have been billed without an answer
        self._in_flight = 0
        self.exhausted = False
        self.stop_reason: Pending | None = None  # why stop() was called; None when the cap was reached

    @property
    def limited(self) -> bool:
        return self._cap is not None or bool(self._caps)

    def worst_case(self, n_tokens: int) -> int:
        return worst_case_micro(n_tokens, self._price, self._margin)

    def _spent(self) -> int:
        """What the run may have been billed, as far as this worker can know: what the balance
        shows (its own answers' costs at least), and the worst case of each of its attempts
        without an answer, which the balance may not show yet."""
        seen = 0 if self._before is None or self._lowest_balance is None else self._before - self._lowest_balance
        return max(seen, self._settled) + self._unanswered

    def _cap_room(self, cap: CapUsage) -> int:
        """The room under CAP; a reading of the statistics may show an attempt without an
        answer: counted twice then, as with the balance."""
        return cap.room(self._settled) - self._unanswered - self._in_flight

    def _room(self) -> float:
        room = math.inf if self._cap is None else self._cap - self._spent() - self._in_flight
        if self._key_budget is not None:
            room = min(room, self._key_budget - self._in_flight)
        for cap in self._caps:
            room = min(room, self._cap_room(cap))
        return room

    def _short_under_a_cap(self, need: int) -> bool:
        return any(self._cap_room(cap) < need for cap in self._caps)

    def reserve_prefix(self, token_counts: Sequence[int]) -> tuple[int, int]:
        """Reserve the worst case of the longest prefix of TOKEN_COUNTS that fits: (items,
        reservation). While requests are in flight whose settling may make room for all of
        them, wait; when a cap is what is short, ask once for fresh account figures; when even
        then not all fit, the guard latches exhausted (the caller sends the prefix, a smaller
        request, and marks the rest pending)."""
        refreshed = self._read_account is None
        while True:
            with self._cond:
                total = self.worst_case(sum(token_counts))
                while not self.exhausted and self._in_flight and total > self._room():
                    self._cond.wait()
                    total = self.worst_case(sum(token_counts))
                if self.exhausted:
                    return 0, 0
                if refreshed or total <= self._room() or not self._short_under_a_cap(total):
                    return self._reserve_fitting(token_counts)
            self.poll(force=True)
            refreshed = True

    def _reserve_fitting(self, token_counts: Sequence[int]) -> tuple[int, int]:
        room, n, tokens = self._room(), 0, 0
        while n < len(token_counts) and self.worst_case(tokens + token_counts[n]) <= room:
            tokens += token_counts[n]
            n += 1
        need = self.worst_case(tokens) if n else 0
        if n < len(token_counts):
            self.exhausted = True
            self._cond.notify_all()
        self._in_flight += need
        return n, need

    def unanswered(self, reservation: int) -> bool:
        """An attempt of the request that holds RESERVATION got no answer and may have been
        billed: it counts as spent at that worst case. Whether the request's retry, on the same
        reservation, still fits."""
        with self._cond:
            self._unanswered += reservation
            return self._room() >= 0

    def settle(self, reservation: int, cost_rub: float | None, balance_after: float | None,
               unanswered: int = 0) -> None:
        """A response came back (cost known) or the request failed (cost None: no answer billed);
        UNANSWERED: its attempts not counted yet that may have been billed without an answer."""
        with self._cond:
            self._in_flight -= reservation
            self._unanswered += unanswered * reservation
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
        """Fresh numbers from the (rate-limited) balance endpoint (see poll)."""
        with self._cond:
            self._observe_balance(balance)
            if key_budget is not None:
                self._key_budget = to_micro(key_budget)
            self._cond.notify_all()  # a larger budget may let a waiting request go

    def poll(self, force: bool = False) -> None:
        """Fresh account figures, when READ_ACCOUNT has some (it keeps within the endpoints'
        rate limit; FORCE: needed now). A statistics reading rebases the caps' usage, unless a
        reading asked for later was applied first."""
        if self._read_account is None or not self.limited:
            return
        with self._cond:
            self._readings += 1
            ticket, settled = self._readings, self._settled
        reading = self._read_account(force)
        if reading is None:
            return
        self.observe_account(reading.balance, reading.budget)
        with self._cond:
            if reading.stats is not None and ticket > self._applied:
                self._applied = ticket
                for cap in self._caps:
                    cap.rebase(to_micro(reading.stats[USAGE[cap.name]]), to_micro(reading.balance), settled)
            self._cond.notify_all()

    def _observe_balance(self, balance: float | None) -> None:
        if balance is None:
            return
        micro = to_micro(balance)
        for cap in self._caps:
            cap.observe_balance(micro)
        if self._before is not None:
            self._lowest_balance = micro if self._lowest_balance is None else min(self._lowest_balance, micro)

    def stop(self, reason: Pending) -> None:
        """Stop spending for REASON (a 402, say): what is not sent yet is pending for it."""
        with self._cond:
            if not self.exhausted:
                self.exhausted, self.stop_reason = True, reason
            self._cond.notify_all()


@dataclasses.dataclass(frozen=True)
class Budget:
    """What a run may spend, as its workers need it: the balance before the run, the
    spendable amount with the caps it honours, the price and its margins, how often the
    account is read, and the driver's preflight."""
    balance_before: float | None
    spendable: Spendable
    price_per_token_rub: float
    margin: float               # until responses show the price
    learned_margin: float       # after: only the token count can be off
    poll_s: float               # the account is read at most this often
    fits: bool = True           # the driver's preflight; False: send nothing, all pending

    @property
    def has_caps(self) -> bool:
        return bool(self.spendable.caps.by_name())

    def guard(self, read_account: Callable[[bool], AccountReading | None] | None) -> BudgetGuard:
        """This worker process's guard; the caps are limits of their own, renewed by READ_ACCOUNT."""
        s = self.spendable
        return BudgetGuard(balance_before=self.balance_before, spendable_rub=s.without_caps,
                           price_per_token_rub=self.price_per_token_rub, margin=self.margin,
                           learned_margin=self.learned_margin,
                           caps=s.cap_usages(self.balance_before) if self.has_caps else (),
                           read_account=read_account)

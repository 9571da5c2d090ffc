"""Real BudgetGuards, one per worker, on a scripted account that bills some attempts late: the
bound transforms/money/budget.py states, in a scenario and in random interleavings (hypothesis'
stateful testing).

The bound, per worker, at the last request (or retry) it sent: what the account was billed up to
the lowest balance that worker had read, plus what that worker was billed afterwards, is within
the cap. So the run exceeds the cap only by what the other workers were billed after that
balance. Each request is 200 tokens at 1 micro-rouble a token: 200 micro-roubles at worst."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from transforms.money.budget import BudgetGuard

BEFORE = 1_000_000      # micro-roubles on the account
CAP = 2_000             # what the run may spend
TOKENS = 200


class Account:
    """The service's side: every charge in order, and who it was for."""

    def __init__(self) -> None:
        self.charges: list[tuple[str, int]] = []

    @property
    def balance_rub(self) -> float:
        return (BEFORE - sum(c for _, c in self.charges)) / 1e6

    def charge(self, worker: str, micro: int) -> float:
        self.charges.append((worker, micro))
        return self.balance_rub


@dataclasses.dataclass
class Worker:
    name: str
    guard: BudgetGuard
    read: int = 0                        # charges its lowest balance read includes
    last_sent_read: int | None = None    # `read` when it last sent an attempt
    request: int | None = None           # the reservation of its request in flight (one at a time)
    late: list[int] = dataclasses.field(default_factory=list)   # its attempts without an answer, not billed yet


def _worker(name: str) -> Worker:
    return Worker(name, BudgetGuard(balance_before=BEFORE / 1e6, spendable_rub=CAP / 1e6,
                                    price_per_token_rub=1e-6, margin=1.0))


def _over(account: Account, worker: Worker) -> int:
    """How far the bound is exceeded for WORKER (<= 0: it holds)."""
    if worker.last_sent_read is None:
        return 0
    seen = sum(c for _, c in account.charges[:worker.last_sent_read])
    own_after = sum(c for who, c in account.charges[worker.last_sent_read:] if who == worker.name)
    return seen + own_after - CAP


def _send(worker: Worker) -> bool:
    n, reservation = worker.guard.reserve_prefix([TOKENS])
    if n:
        worker.request, worker.last_sent_read = reservation, worker.read
    return bool(n)


def _answer(account: Account, worker: Worker, cost: int) -> None:
    assert worker.request is not None
    worker.guard.settle(worker.request, cost / 1e6, account.charge(worker.name, cost))
    worker.read, worker.request = len(account.charges), None


def _read_balance(account: Account, worker: Worker) -> None:
    worker.guard.observe_account(account.balance_rub, None)
    worker.read = len(account.charges)


@pytest.mark.parametrize("late", [1, 2, 5])
def test_attempts_billed_late_still_count_once_another_workers_spending_shows(late):
    """Worker A's requests time out (the service bills them later); worker B's spending then
    shows in the balance A reads, as much as A's attempts could cost. A must still count them:
    taking the balance for them, it spent 2,200, 2,400 and 3,000 under a cap of 2,000."""
    account, a, b = Account(), _worker("a"), _worker("b")
    for _ in range(late):
        assert _send(a)
        a.guard.settle(a.request, None, None, unanswered=1)   # timed out, given up: pending
        a.late.append(a.request)
        a.request = None
    for _ in range(late):
        assert _send(b)
        _answer(account, b, TOKENS)
    _read_balance(account, a)
    while _send(a):
        _answer(account, a, TOKENS)
    for micro in a.late:
        account.charge("a", micro)
    assert sum(c for _, c in account.charges) <= CAP
    assert _over(account, a) <= 0 and _over(account, b) <= 0


class SharedAccount(RuleBasedStateMachine):
    """Two or three workers, each with at most one request in flight (so `reserve_prefix` never
    waits: the machine runs in one thread), answered at their worst case or less, timing out
    (retried while the guard's room holds it) or failing without an answer; attempts without an
    answer billed late, at any moment, or never; balances read now and then."""

    def __init__(self) -> None:
        super().__init__()
        self.account = Account()
        self.workers: list[Worker] = []

    @initialize(n=st.integers(2, 3))
    def start(self, n):
        self.workers = [_worker(name) for name in "abc"[:n]]

    def _idle(self) -> list[Worker]:
        return [w for w in self.workers if w.request is None]

    def _busy(self) -> list[Worker]:
        return [w for w in self.workers if w.request is not None]

    @precondition(lambda self: any(w.request is None and not w.guard.exhausted for w in self.workers))
    @rule(data=st.data())
    def send(self, data):
        _send(data.draw(st.sampled_from([w for w in self._idle() if not w.guard.exhausted])))

    @precondition(lambda self: any(w.request is not None for w in self.workers))
    @rule(data=st.data(), cheaper=st.integers(0, TOKENS // 2))
    def answer(self, data, cheaper):
        worker = data.draw(st.sampled_from(self._busy()))
        _answer(self.account, worker, worker.request - cheaper)

    @precondition(lambda self: any(w.request is not None for w in self.workers))
    @rule(data=st.data(), billed_now=st.booleans())
    def time_out(self, data, billed_now):
        """An attempt gets no answer: billed before anyone reads (a 5xx after the charge) or
        late; the retry goes if the guard still has room for it."""
        worker = data.draw(st.sampled_from(self._busy()))
        if billed_now:
            self.account.charge(worker.name, worker.request)
        else:
            worker.late.append(worker.request)
        if worker.guard.unanswered(worker.request):
            worker.last_sent_read = worker.read    # the retry is sent
        else:
            worker.guard.settle(worker.request, None, None)
            worker.request = None

    @precondition(lambda self: any(w.request is not None for w in self.workers))
    @rule(data=st.data())
    def fail(self, data):
        """The last attempt of a request gets no answer (counted when it is settled); late."""
        worker = data.draw(st.sampled_from(self._busy()))
        worker.late.append(worker.request)
        worker.guard.settle(worker.request, None, None, unanswered=1)
        worker.request = None

    @precondition(lambda self: any(w.late for w in self.workers))
    @rule(data=st.data(), billed=st.booleans())
    def late_charge(self, data, billed):
        """The service ends an attempt the client gave up on: bills it (or never does)."""
        worker = data.draw(st.sampled_from([w for w in self.workers if w.late]))
        micro = worker.late.pop(data.draw(st.integers(0, len(worker.late) - 1)))
        if billed:
            self.account.charge(worker.name, micro)

    @rule(data=st.data())
    def read_balance(self, data):
        _read_balance(self.account, data.draw(st.sampled_from(self.workers)))

    @invariant()
    def within_the_bound(self):
        assert all(_over(self.account, w) <= 0 for w in self.workers)

    def teardown(self):
        """Whatever is still out is billed late: the bound holds when everything is in."""
        for worker in self.workers:
            for micro in itertools.chain(worker.late, [worker.request] if worker.request else []):
                self.account.charge(worker.name, micro)
        assert all(_over(self.account, w) <= 0 for w in self.workers)


def test_the_bound_holds_in_random_interleavings():
    run_state_machine_as_test(SharedAccount, settings=settings(max_examples=150, stateful_step_count=40,
                                                               deadline=None))


@pytest.mark.soak
def test_the_bound_holds_in_many_more_interleavings():
    run_state_machine_as_test(SharedAccount, settings=settings(max_examples=1000, stateful_step_count=80,
                                                               deadline=None))

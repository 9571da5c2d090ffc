"""Whether anyone else is spending on the account, read from the balance every answer carries
(`usage.balance`, after its charge): the shared counter the budget reads too
(transforms/money/budget.py). No Beam, no money rules here: integers in, a flag out. Not
thread-safe: the limiter calls it under its lock.

Why the limiter needs it: a service that refuses past its capacity (429) says nothing when a
place frees, so a process that drew a 429 while other processes ran holds under that level for
a probe's wait counted in answers. When the others finish first, the one left runs alone under a
level that was its share, not the account's (bench: 20 s of one request in flight on a capacity
of 4 that nobody else used, half the run).

How: the balance falls by every charge to the account. Between two of this process's answers,
what it fell by beyond this process's own costs is what others spent, give or take this
process's requests charged but not answered yet (at most as many as it had in flight, at either
end: the tolerance). Others spending more than twice the tolerance over a window of round trips:
shared. Then alone only after a quiet span in which, at their mean rate since, they would have
spent `_SIGNIFICANT` tolerances (a spender that sends now and then is not gone because it
paused), twice as long after each time it said so (each one may cost a 429 to find the capacity
again). A top-up (the balance rising) hides what others spend until the balance falls under its
lowest again, so it may be told once too soon; the baseline stays the lowest balance seen,
because an answer that comes late carries a balance above it without any top-up.
"""
from __future__ import annotations

import bisect

_WINDOW_RTTS = 3     # x (places + 1): the window that tells "shared", in round trips; one other
                     # process with a single request in flight spends in it over twice the tolerance
_SIGNIFICANT = 8     # tolerances the others would spend, at their rate, in a quiet span that means
                     # gone (a steady spender at random times spends <= 1 of 8 expected: 0.3%)
_MAX_DOUBLINGS = 4


class AccountSharing:
    """`answered` once per answer; `shared` is the state it last decided (it keeps it while
    the others' spending is between one and two tolerances)."""

    def __init__(self) -> None:
        self.told = 0                     # times it said the others had stopped
        self._lowest: int | None = None   # the balance baseline: answers may come out of order
        self._dropped = 0                 # how far it fell since the first answer
        self._own = 0                     # this process's costs since then
        self._largest = 0                 # the largest cost of one of its requests
        self._since: tuple[float, int] | None = None   # while shared: (when they were first seen, their spending then)
        self._rate = 0.0                  # what they spent a second, from then to the last window that showed them
        self._seen: list[tuple[float, int, int]] = []   # (at, others' spending, places), every half round trip

    @property
    def shared(self) -> bool:
        return self._since is not None

    def answered(self, at: float, cost: int, balance: int, places: int, round_trip_s: float) -> bool:
        """An answer at AT (seconds) that cost COST and left BALANCE (micro-units), with PLACES
        in flight allowed (or in flight, if more) and a round trip of ROUND_TRIP_S. True when it
        shows that the others who shared the account have stopped spending."""
        self._largest = max(self._largest, cost)
        if self._lowest is None:   # the baseline: this answer's own charge is already in it
            self._lowest = balance
        else:
            self._own += cost
            if balance < self._lowest:
                self._dropped += self._lowest - balance
                self._lowest = balance
        others = self._dropped - self._own
        window = _WINDOW_RTTS * (places + 1) * round_trip_s
        spent = self._spent_since(at, window, others, places, or_oldest=True)   # a shorter span is stricter
        if spent is not None and spent[0] > 2 * spent[1]:   # their rate: the mean since first seen
            self._since = self._since or (spent[2], others - spent[0])
            since_spent = others - self._since[1]   # a top-up hides theirs and lowers ours: never <= 0
            if since_spent > 0:
                self._rate = since_spent / max(1e-9, at - self._since[0])
        told, quiet = False, window
        if self._since is not None:
            quiet = max(window, _SIGNIFICANT * places * self._largest / max(1e-9, self._rate))
            quiet *= 2 ** min(self.told, _MAX_DOUBLINGS)
            spent = self._spent_since(at, quiet, others, places)
            if spent is not None and spent[0] <= spent[1]:
                told, self._since = True, None
                self.told += 1
        if not self._seen or at - self._seen[-1][0] >= round_trip_s / 2:
            self._seen.append((at, others, places))
        keep = bisect.bisect_right(self._seen, at - 2 * quiet, key=lambda e: e[0])
        if keep > len(self._seen) // 2:   # amortised: entries are dropped in halves
            del self._seen[:keep]
        return told

    def _spent_since(self, at: float, span: float, others: int, places: int,
                     or_oldest: bool = False) -> tuple[int, int, float] | None:
        """(what others spent since the last entry at least SPAN seconds before AT, the
        tolerance, that entry's time); None if no entry is that old (OR_OLDEST: the oldest)."""
        i = bisect.bisect_right(self._seen, at - span, key=lambda e: e[0]) - 1
        if i < 0 and not (or_oldest and self._seen):
            return None
        then, spent, places_then = self._seen[max(i, 0)]
        return others - spent, max(places, places_then) * self._largest, then

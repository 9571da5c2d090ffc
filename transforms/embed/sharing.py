"""Whether anyone else is spending on the account, read from the balance every answer carries
(`usage.balance`, after its charge): the shared counter the budget reads too
(transforms/money/budget.py). No Beam, no money rules here: integers in, a flag out.

Why the limiter needs it: a service that refuses past its capacity (429) says nothing when a
place frees, so a process that drew a 429 while other processes ran holds under that level for
a probe's wait counted in answers. When the others finish first, the one left runs alone under a
level that was its share, not the account's (bench: 20 s of one request in flight on a capacity
of 4 that nobody else used, half the run). The balance falls by every charge to the account:
over a window of this process's answers, what it fell by beyond this process's own costs is what
others spent, give or take this process's requests charged but not answered yet (at most as
many as it has in flight, at either end of the window). A top-up (the balance rising) hides
what others spend until the balance falls under its lowest again: at worst, one probe too soon.
"""
from __future__ import annotations

import collections

_WINDOW_RTTS = 3   # x (places + 1): a window's length in round trips; one other process with a
                   # single request in flight spends in it more than twice the tolerance (4: the
                   # last process left in the bench saw it 2.5-3 s after the other finished)


class AccountSharing:
    """`answered` once per answer; `shared` says what the last full window showed."""

    def __init__(self):
        self.shared = False
        self._lowest: int | None = None   # the lowest balance seen: answers may come out of order
        self._dropped = 0                 # how far it fell since the first answer
        self._own = 0                     # this process's costs since then
        self._largest = 0                 # the largest cost of one of its requests
        self._seen: collections.deque = collections.deque()   # (at, dropped, own)

    def answered(self, at: float, cost: int, balance: int, places: int, round_trip_s: float) -> bool:
        """An answer at AT (seconds) that cost COST and left BALANCE (micro-units), with PLACES
        in flight allowed and a round trip of ROUND_TRIP_S. True when it shows that the others
        who shared the account have stopped spending (once per such change)."""
        self._largest = max(self._largest, cost)
        if self._lowest is None:   # the baseline: this answer's own charge is already in it
            self._lowest = balance
        else:
            self._own += cost
            if balance < self._lowest:
                self._dropped += self._lowest - balance
                self._lowest = balance
        self._seen.append((at, self._dropped, self._own))
        start = at - _WINDOW_RTTS * (places + 1) * round_trip_s
        while len(self._seen) > 1 and self._seen[1][0] <= start:
            self._seen.popleft()
        then, dropped, own = self._seen[0]
        if then > start:
            return False   # not a whole window yet
        others = (self._dropped - dropped) - (self._own - own)
        tolerance = places * self._largest   # charged, not answered yet, at either end
        if others > 2 * tolerance:
            self.shared = True
        elif others <= tolerance and self.shared:
            self.shared = False
            return True
        return False

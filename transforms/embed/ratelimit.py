"""How many of the Embed step's requests may be in flight, found from the answers alone (no Beam;
a known quota: quota.py). docs/scale.md explains it for users, with a picture against a capacity.

ConcurrencyLimiter is a congestion window, per worker process, with no coordinator:
- Start: low (`initial`), +1 per answer while full (slow start) until the first sign of a queue
  or a 429, then +1 per round trip. Before the first answer a request out `admitted_after_s`
  without a 429 counts as let in, so the limit may ramp to `_RAMP_FACTOR` x its start.
- 429 (the client's on_retry hook, or the final error): halve, at most once per window; the
  request gives its place back until the rest fit. The level that drew it is a plateau, probed
  after `_PROBE_ANSWERS` x the level answers (`_PROBE_LATER` x that once a probe was refused): a
  refusing service says nothing when places free, and each probe costs a 429.
- Latency: an answer against the fastest recent one of at least its size, as a ratio. In slow
  start one answer `_QUEUED` x slower brings the limit to what fits (Gradient2); after it, one
  decision per round trip: a mean of `_SLOWER` brings it down the same way, else a step up is
  kept only if answers per second grew by `_WORTH` of the concurrency it added (Vegas-like),
  else +1. A service that only gets slower while answering more is still climbed.
- Once after slow start, the limit is halved until one request goes (BBR's ProbeRTT): a process
  that started into another's queue measures its latency without its own.
- A read timeout (the client's on_timeout hook): a queue the latency signal came too late for;
  one place, as TCP's window after a retransmission timeout, and the timed-out request's one
  retry waits until the others are answered.
- Below one place (more processes than places): `_STRIKES` 429s at one place, each soon after the
  last, halve on down to `_PACED_FLOOR`; a limit L < 1 is one request, then (1 / L - 1) round
  trips of nothing, growing by `_PACED_STEP` per round trip, so the smallest share climbs too.
- When the balance shows nobody else spends any more (sharing.py), the plateau, its wait and
  the strikes go: the last process left climbs to the capacity.
The concurrency a round trip measured is the mean in-flight count its requests were sent with;
growth needs the limit full when an answer comes (an unused limit proves nothing).
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import overload

from transforms.embed.sharing import AccountSharing

OK, RATE_LIMITED, IGNORED = "ok", "rate_limited", "ignored"
_OUTCOMES = (OK, RATE_LIMITED, IGNORED)

# Latency reference: the fastest of the last _WINDOW clean answers (one attempt, 200) of at least
# _SIZE_SLACK x the size; within that slack, size explains the difference.
_WINDOW = 500
_SIZE_SLACK = 0.9
_SLOWER = 1.5    # latency / expected that ends slow start, and over a round trip brings the limit down
                 # (a mean over a round trip, not one answer at _QUEUED: each process sees the
                 # queue of all, and at _QUEUED two processes held 1.5x a capacity between them)
_QUEUED = 2.0    # latency / expected of one answer in slow start at which half of it is a queue
_WORTH = 0.5     # a step up must raise the throughput by at least this share of the concurrency added
_PROBE_ANSWERS = 32   # x the 429's level: answers under it before the first probe of that level
_PROBE_LATER = 2      # x that: the wait once a probe drew another 429. Twice, not doubling on: the
                      # process left with the work when others finish would wait out a wait that
                      # grew while they ran (simulated: 1.4x the ideal time against 1.1x)
_RAMP_FACTOR = 4      # x the initial limit: how far it may grow before the first answer
_PACED_FLOOR = 1 / 32  # the lowest limit: one request per 32 round trips
_PACED_STEP = 1 / 8    # below one place: growth per round trip of time
_STRIKES = 3          # 429s at one place, each within a probe's wait of the last, before fewer
_UNKNOWN_RTT_S = 1.0   # a round trip's length before any clean answer timed one

class Permit:
    """One granted place. `rate_limited()` may be called while the request is still retrying
    (the client's on_retry hook): the other threads slow down at once, and it returns when
    the retry may go."""
    __slots__ = ("_limiter", "epoch", "level", "sent_with", "released")

    def __init__(self, limiter: ConcurrencyLimiter, epoch: int, level: int, sent_with: int):
        self._limiter, self.epoch, self.level, self.sent_with = limiter, epoch, level, sent_with
        self.released = False

    def rate_limited(self) -> None:
        self._limiter._throttle(self)
        self._limiter._park(self)

    def timed_out(self) -> None:
        """The request's attempt timed out: the others slow down at once, and it returns when
        its retry may go."""
        self._limiter._timed_out(self)
        self._limiter._park(self)

    def release(self, outcome: str = OK, *, tokens: int | None = None, latency_s: float | None = None,
                cost: int | None = None, balance: int | None = None) -> None:
        self._limiter.release(self, outcome, tokens=tokens, latency_s=latency_s, cost=cost, balance=balance)


class ConcurrencyLimiter:
    def __init__(self, initial: float, minimum: float = _PACED_FLOOR, maximum: float = 64, *,
                 admitted_after_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        """ADMITTED_AFTER_S: the ramp before the first answer (above); None: none."""
        if not (0 < minimum <= initial <= maximum and initial >= 1):
            raise ValueError(f"need 0 < minimum <= initial <= maximum and initial >= 1, "
                             f"got {minimum}, {initial}, {maximum}")
        if admitted_after_s is not None and admitted_after_s <= 0:
            raise ValueError(f"admitted_after_s must be > 0, got {admitted_after_s}")
        self._min, self._max = float(minimum), float(maximum)
        self._limit = float(initial)
        self._clock = clock
        self._admitted_after_s = admitted_after_s
        self._ramp_to = min(self._max, _RAMP_FACTOR * self._limit)
        self._ramping = admitted_after_s is not None   # until the first answer or 429
        self._granted_at = clock()                     # when the last place was given
        self._in_flight = 0
        self._paced_until = float("-inf")   # below one place: no request before this
        self._rtt: float | None = None      # smoothed latency of clean answers
        self._since_429 = _PROBE_ANSWERS    # answers since the last 429 that counted
        self._answered_at = clock()         # the last answer (or the start)
        self._strikes = 0                   # 429s at one place or fewer, each soon after the last
        self._epoch = 0              # bumped by every decrease
        self._level = 0              # bumped by every change of the limit
        self._slow_start = True
        self._answers = self._timed = 0   # answers (and those with a latency) this round trip
        self._ratios = 0.0                # their latency / expected, summed
        self._sent = 0                    # and the in-flight counts they were sent with, summed
        self._seen: dict[int, tuple[float, int]] = {}   # in flight at send -> (latency / expected, answers)
        self._recent: collections.deque[tuple[int, float]] = collections.deque(maxlen=_WINDOW)   # (tokens, latency_s)
        self._plateau: int | None = None   # the level that drew the last 429
        self._probe_wait = 0               # answers under the plateau before probing it
        self._under = 0
        self._drain_due = True               # once, after slow start (above)
        self._restore: float | None = None   # while draining: the limit to give back
        self._sharing = AccountSharing()
        self._cond = threading.Condition(threading.RLock())
        self.peak = self._limit
        self.decreases = self.latency_decreases = self.drains = self.others_left = 0
        self.rate_limited_count = 0
        self.timeouts = 0

    @property
    def limit(self) -> float:
        return self._limit

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now (below one place: one, paced; `paced_until`)."""
        return max(1, int(self._limit))

    @property
    def settled(self) -> int:
        """The places it holds outside a drain, for the metrics: a drain lasts until one request
        goes, and at the end of a run none may."""
        return max(1, int(self._restore if self._restore is not None else self._limit))

    def answered_within(self, seconds: float) -> bool:
        """Whether an answer came (or the limiter was made) within the last SECONDS, plus two
        of this limiter's own paced cycles (at the floor, a round trip of 30 s is a cycle of
        16 minutes: that silence is its own doing, not the service's)."""
        with self._cond:
            cycle = self._round_trip() / self._limit if self._limit < 1 else 0.0
            return self._clock() - self._answered_at < seconds + 2 * cycle

    @property
    def paced_until(self) -> float:
        """Below one place, when the next request may go (on the limiter's clock)."""
        return self._paced_until

    @property
    def in_flight(self) -> int:
        return self._in_flight

    @overload
    def acquire(self, timeout: None = None) -> Permit: ...
    @overload
    def acquire(self, timeout: float) -> Permit | None: ...

    def acquire(self, timeout: float | None = None) -> Permit | None:
        """Block until a place is free; None if `timeout` seconds passed first."""
        with self._cond:
            deadline = None if timeout is None else self._clock() + timeout
            while not self._may_send(now := self._clock()):
                ramp_at = self._ramp_at()
                if ramp_at is not None and now >= ramp_at:
                    self._grow()
                    continue
                if deadline is not None and now >= deadline:
                    return None
                paced = self._paced_until if self._paced_until > now else None
                waits = [t - now for t in (ramp_at, deadline, paced) if t is not None]
                self._cond.wait(min(waits) if waits else None)
            self._in_flight += 1
            self._granted_at = self._clock()
            permit = Permit(self, self._epoch, self._level, self._in_flight)
            self._end_drain()   # its request is out
            return permit

    def _may_send(self, now: float) -> bool:
        return self._in_flight < self.allowed and now >= self._paced_until

    def _round_trip(self) -> float:
        return self._rtt if self._rtt is not None else _UNKNOWN_RTT_S

    def _pace(self) -> None:
        """Below one place, a request is followed by (1 / limit - 1) round trips of nothing."""
        if self._limit < 1:
            self._paced_until = self._clock() + self._round_trip() * (1 / self._limit - 1)

    def _ramp_at(self) -> float | None:
        """When the ramp before the first answer adds the next place, if it still may."""
        if not self._ramping or self._admitted_after_s is None or self._limit >= self._ramp_to:
            return None
        return self._granted_at + self._admitted_after_s

    def release(self, permit: Permit, outcome: str = OK, *, tokens: int | None = None,
                latency_s: float | None = None, cost: int | None = None, balance: int | None = None) -> None:
        """OUTCOME of the request; for a clean answer (OK, one attempt) its TOKENS and
        LATENCY_S, the latency signal; for any answer its COST and the account's BALANCE after
        it (micro-units), the sign of others spending on the account."""
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}, got {outcome!r}")
        with self._cond:
            if permit.released:
                raise RuntimeError("permit released twice")
            permit.released = True
            self._ramping = False   # an answer, an error or a 429: from now on, the signals decide
            try:
                if outcome == RATE_LIMITED:
                    self._throttle(permit)
                elif outcome == OK:
                    self._answered_at = self._clock()
                    self._answered(permit, tokens, latency_s)
                    if cost is not None and balance is not None and self._sharing.answered(   # in flight: this one too
                            self._answered_at, cost, balance, max(self.allowed, self._in_flight), self._round_trip()):
                        self._alone()
                self._pace()
            finally:   # whatever the signals did, the place is given back
                self._in_flight -= 1
                self._cond.notify_all()

    def _answered(self, permit: Permit, tokens: int | None, latency_s: float | None) -> None:
        ratio = None
        if tokens is not None and latency_s is not None and latency_s > 0:
            expected = min((s for t, s in self._recent if t >= _SIZE_SLACK * tokens), default=None)
            self._recent.append((tokens, latency_s))
            self._rtt = latency_s if self._rtt is None else 0.875 * self._rtt + 0.125 * latency_s
            if expected is not None:
                ratio = max(1.0, latency_s / expected)
        self._since_429 += 1
        if permit.epoch != self._epoch:   # sent before the last decrease: its latency is old news
            return
        if ratio is not None:   # what the latency was at each concurrency it was sent with
            known, n = self._seen.get(permit.sent_with, (ratio, 0))
            self._seen[permit.sent_with] = ((known + ratio) / 2 if n else ratio, n + 1)
        if self._plateau is not None and self._limit + 1 >= self._plateau:
            self._under += 1
        if self._limit < 1:
            self._paced_answer()
            return
        in_use = self._in_flight >= int(self._limit)   # full when this answer came (it counts)
        if self._slow_start:
            if ratio is not None and ratio >= _QUEUED:
                self._latency_decrease(min(self._limit, permit.sent_with), ratio)
            elif ratio is not None and ratio >= _SLOWER:   # from now on, one step per round trip,
                self._decrease(min(self._limit, permit.sent_with))   # from where it was seen
                self.latency_decreases += 1
            elif in_use:
                self._grow()
            return
        if permit.level != self._level:   # a round trip is measured on requests sent at this limit
            return
        if ratio is not None:
            self._ratios += ratio
            self._sent += permit.sent_with
            self._timed += 1
        self._answers += 1
        if self._answers < int(self._limit):
            return
        mean = self._ratios / self._timed if self._timed else None   # over one round trip
        sent_with = self._sent / self._timed if self._timed else 0.0   # the concurrency it measured
        self._answers = self._timed = self._sent = 0
        self._ratios = 0.0
        self._level += 1   # the next round trip starts here, whatever is decided
        if mean is None:
            if in_use:
                self._grow()
            return
        below = max((k for k, (_, n) in self._seen.items() if k <= round(sent_with) - 1 and n >= 2), default=None)
        if mean >= _SLOWER:
            self._latency_decrease(sent_with, mean)
        elif below is not None and \
                sent_with / mean < below / self._seen[below][0] * (1 + _WORTH * (sent_with - below) / below):
            self._decrease(below)            # the step up from there bought too little
            self.latency_decreases += 1
        elif self._drain_due and self._plateau is None and self._limit >= 2:
            self._drain()
        elif in_use:
            self._grow()

    def _paced_answer(self) -> None:
        """Below one place each answer is a round trip of its own, and they come 1 / limit
        round trips apart: growth per answer is STEP / limit, STEP per round trip of time
        whatever the limit (AIMD on the rate: counted in answers, the process with the smallest
        share grew slowest), but at most doubling per answer, so that a process at the floor
        does not leap to several places on one answer (from 1/32 back to one place: ~60 round
        trips). No probe wait here: in the simulator it cut no 429s and cost up to 1.4x the
        wall."""
        self._limit = min(self._max, 2 * self._limit, self._limit + _PACED_STEP / self._limit)
        self.peak = max(self.peak, self._limit)
        self._level += 1
        if self._plateau is not None and self._limit >= self._plateau:
            self._plateau = None

    def _alone(self) -> None:
        """Nobody else spends on the account any more: what their share taught goes."""
        self._plateau, self._probe_wait, self._under, self._strikes = None, 0, 0, 0
        if self._limit < 1:
            self._limit, self._paced_until = 1.0, float("-inf")
            self._level += 1
        self.others_left += 1

    def _latency_decrease(self, concurrency: float, ratio: float) -> None:
        """Gradient2's gradient: what fits is the concurrency the latency was measured at x
        expected / latency; never under one place, where a queue is at most one request of each
        process, and fewer could leave the service idle (2 processes on a capacity of 1: 1.16x
        the floor paced by latency, 1.04x at one place each)."""
        self._decrease(max(1.0, concurrency / ratio))
        self.latency_decreases += 1

    def _grow(self) -> None:
        if self._plateau is not None:
            if self._limit >= self._plateau:   # probed it, and an answer came back: no plateau
                self._plateau = None
            elif self._limit + 1 >= self._plateau and self._under < self._probe_wait:
                return                         # the next step would probe the 429's level: not yet
        self._limit = min(self._max, self._limit + 1)
        self.peak = max(self.peak, self._limit)
        self._level += 1

    def _drain(self) -> None:
        """Half the limit until one request goes (acquire gives it back): no decrease, nothing
        learnt about the concurrency, only a chance for the reference to see no queue of ours."""
        self._drain_due, self._restore = False, self._limit
        self._limit = max(self._min, self._limit / 2)
        self._level += 1
        self.drains += 1

    def _end_drain(self) -> None:
        """A request went at half the limit, or the limit is about to move for a signal."""
        if self._restore is not None:
            self._limit, self._restore = self._restore, None
            self._level += 1

    def _decrease(self, to: float) -> None:
        """To TO, but at most halving at once: one noisy answer cannot take the limit to 1."""
        self._end_drain()
        self._limit = max(self._min, self._limit / 2, min(self._limit, to))
        self._slow_start = False
        self._answers = self._timed = self._sent = 0
        self._ratios = 0.0
        self._epoch += 1
        self._level += 1
        self.decreases += 1

    def _throttle(self, permit: Permit) -> None:
        with self._cond:
            self.rate_limited_count += 1
            self._ramping = False
            if permit.epoch < self._epoch:   # sent before the last decrease: already answered
                return
            self._end_drain()
            if self._limit >= 1:   # a plateau and its probe wait from one place up; below, AIMD alone
                level = int(self._limit)
                if self._plateau is not None and level >= self._plateau - 1:
                    self._probe_wait = _PROBE_LATER * _PROBE_ANSWERS * level   # probed that level again
                else:
                    self._probe_wait = _PROBE_ANSWERS * level
                self._plateau, self._under = level, 0
            # one place goes to fewer only after _STRIKES 429s, each within a probe's wait of the
            # last; below one place each 429 halves
            self._strikes = self._strikes + 1 if self._since_429 < _PROBE_ANSWERS and self._limit < 2 else 0
            self._since_429 = 0
            below = self._limit < 1 or self._strikes >= _STRIKES
            self._decrease(self._limit / 2 if below else max(1.0, self._limit / 2))

    def _timed_out(self, permit: Permit) -> None:
        with self._cond:
            self.timeouts += 1
            self._ramping = False
            self._end_drain()
            if self._limit > 1:
                self._decrease(1.0)
                self._limit = 1.0   # not only halved (_decrease): a timeout is no noise

    def _park(self, permit: Permit) -> None:
        """A rate-limited request gives its place back and waits until the in-flight count is
        under the (lowered) limit, and below one place for the pause, before it retries."""
        with self._cond:
            self._pace()
            self._in_flight -= 1
            self._cond.notify_all()
            try:
                while not self._may_send(now := self._clock()):
                    self._cond.wait(self._paced_until - now if self._in_flight < self.allowed else None)
            finally:   # the caller releases the permit whatever happens: its place must be held
                self._in_flight += 1
            permit.epoch, permit.sent_with = self._epoch, self._in_flight   # its retry goes at this limit


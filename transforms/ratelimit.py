"""Client-side rate control for the Embed step's threads (no Beam here).

- AimdLimiter: how many requests may be in flight. A 429 multiplies the limit by `decrease`
  (at most once per window: requests already in flight when the limit dropped were sent
  at the old rate, so their 429s are not news); every `limit` successes add `increase`, as
  TCP's congestion avoidance does. A success counts only while at least half the limit is
  in use (a caller that never fills the limit proves nothing about a larger one).
- TokenBucketLimiter: requests per minute and tokens per minute, client side, so a known
  quota is not discovered by 429s. Each call reserves its turn under a lock and then sleeps
  outside it: callers are served in order and never spin.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import Callable, Iterator

OK, RATE_LIMITED, IGNORED = "ok", "rate_limited", "ignored"
_OUTCOMES = (OK, RATE_LIMITED, IGNORED)


class Permit:
    """One granted slot. `rate_limited()` may be called while the request is still retrying
    (the client's on_retry hook), so the other threads slow down at once."""
    __slots__ = ("_limiter", "epoch", "throttled", "released")

    def __init__(self, limiter: "AimdLimiter", epoch: int):
        self._limiter, self.epoch = limiter, epoch
        self.throttled = self.released = False

    def rate_limited(self) -> None:
        self._limiter._throttle(self)

    def release(self, outcome: str = OK) -> None:
        self._limiter.release(self, outcome)


class AimdLimiter:
    def __init__(self, initial: float, minimum: float = 1, maximum: float = 64,
                 increase: float = 1, decrease: float = 0.5):
        if not 1 <= minimum <= initial <= maximum:
            raise ValueError(f"need 1 <= minimum <= initial <= maximum, got {minimum}, {initial}, {maximum}")
        if increase <= 0 or not 0 < decrease < 1:
            raise ValueError("increase must be > 0 and decrease in (0, 1)")
        self._min, self._max, self._inc, self._dec = float(minimum), float(maximum), increase, decrease
        self._limit = float(initial)
        self._in_flight = 0
        self._epoch = 0          # bumped by every decrease
        self._successes = 0      # counted toward the next increase
        self._cond = threading.Condition()
        self.decreases = 0
        self.rate_limited_count = 0

    @property
    def limit(self) -> float:
        return self._limit

    @property
    def allowed(self) -> int:
        """Requests that may be in flight now."""
        return int(self._limit)

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def acquire(self, timeout: float | None = None) -> Permit | None:
        """Block until a slot is free; None if `timeout` seconds passed first."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_flight < int(self._limit), timeout):
                return None
            self._in_flight += 1
            return Permit(self, self._epoch)

    def release(self, permit: Permit, outcome: str = OK) -> None:
        if outcome not in _OUTCOMES:
            raise ValueError(f"outcome must be one of {_OUTCOMES}, got {outcome!r}")
        with self._cond:   # an RLock: _throttle may take it again
            if permit.released:
                raise RuntimeError("permit released twice")
            permit.released = True
            if outcome == RATE_LIMITED:
                self._throttle(permit)
            if outcome == OK and not permit.throttled and 2 * self._in_flight >= int(self._limit):
                self._successes += 1
                if self._successes >= int(self._limit):
                    self._limit = min(self._max, self._limit + self._inc)
                    self._successes = 0
            self._in_flight -= 1
            self._cond.notify_all()

    def _throttle(self, permit: Permit) -> None:
        with self._cond:
            self.rate_limited_count += 1
            if permit.throttled:
                return
            permit.throttled = True
            if permit.epoch < self._epoch:   # sent before the last decrease: already answered
                return
            self._limit = max(self._min, self._limit * self._dec)
            self._successes = 0
            self._epoch += 1
            self.decreases += 1

    @contextlib.contextmanager
    def slot(self) -> Iterator[Permit]:
        """`with limiter.slot() as permit:` releases OK on return, RATE_LIMITED when the
        block raised an error with status 429, IGNORED for any other error."""
        permit = self.acquire()
        try:
            yield permit
        except BaseException as exc:
            self.release(permit, RATE_LIMITED if getattr(exc, "status", None) == 429 else IGNORED)
            raise
        self.release(permit, OK)


class _Bucket:
    """Level at time `last`, possibly negative (a request larger than the burst borrows)."""
    __slots__ = ("rate", "capacity", "level", "last")

    def __init__(self, per_minute: float, burst_s: float, now: float):
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate * burst_s)
        self.level, self.last = self.capacity, now

    def level_at(self, t: float) -> float:
        return min(self.capacity, self.level + self.rate * max(0.0, t - self.last))

    def ready_at(self, t: float, n: float) -> float:
        """Earliest time >= t at which the level covers n (or the whole burst, if n is larger)."""
        t = max(t, self.last)
        short = min(n, self.capacity) - self.level_at(t)
        return t + max(0.0, short / self.rate)

    def take(self, t: float, n: float) -> None:
        self.level, self.last = self.level_at(t) - n, t


class TokenBucketLimiter:
    """Blocks until one request slot and `tokens` tokens are available; 0 turns a limit off.
    `burst_s`: seconds of quota that may go at once (providers enforce per-minute quotas over
    shorter windows, so a full minute's burst would draw 429s)."""

    def __init__(self, requests_per_minute: float = 0, tokens_per_minute: float = 0, *,
                 burst_s: float = 1.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        if requests_per_minute < 0 or tokens_per_minute < 0 or burst_s <= 0:
            raise ValueError("limits must be >= 0 and burst_s > 0")
        self._clock, self._sleep = clock, sleep
        now = clock()
        self._requests = _Bucket(requests_per_minute, burst_s, now) if requests_per_minute else None
        self._tokens = _Bucket(tokens_per_minute, burst_s, now) if tokens_per_minute else None
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self._requests is not None or self._tokens is not None

    def reserve(self, tokens: int = 0) -> float:
        """Take the quota of one request of `tokens` tokens; the seconds to wait before sending."""
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        wanted = [(b, n) for b, n in ((self._requests, 1), (self._tokens, tokens)) if b is not None]
        if not wanted:
            return 0.0
        with self._lock:
            now = self._clock()
            at = max(b.ready_at(now, n) for b, n in wanted)
            for b, n in wanted:
                b.take(at, n)
        return at - now

    def acquire(self, tokens: int = 0) -> float:
        """Block until the request may go; returns the seconds waited."""
        wait = self.reserve(tokens)
        if wait > 0:
            self._sleep(wait)
        return wait

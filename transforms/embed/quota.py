"""Client-side quotas for the Embed step's threads (no Beam here): TokenBucketLimiter keeps
requests per minute and tokens per minute, so a known quota is not discovered by 429s. Each
call reserves its turn under a lock and then sleeps outside it: callers are served in order
and never spin."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable


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

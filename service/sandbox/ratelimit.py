"""Token buckets per key: the account endpoints' limit and the optional embeddings limit."""
from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable


class TokenBuckets:
    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic):
        self._rate, self._burst, self._clock = rate, burst, clock
        self._state: dict[str, tuple[float, float]] = {}   # key -> (tokens, last refill)
        self._lock = threading.Lock()

    def take(self, key: str) -> int:
        """0 when a call is allowed now, else the whole seconds to wait (Retry-After)."""
        with self._lock:
            now = self._clock()
            tokens, last = self._state.get(key, (self._burst, now))
            tokens = min(self._burst, tokens + (now - last) * self._rate)
            if tokens >= 1.0:
                self._state[key] = (tokens - 1.0, now)
                return 0
            self._state[key] = (tokens, now)
            return max(1, math.ceil((1.0 - tokens) / self._rate))

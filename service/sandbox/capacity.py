"""A service with a capacity: at most N embeddings requests per account worked on at once.

What an overloaded upstream does past its capacity is one of two things, and clients must cope
with both: it queues (requests wait for a worker, so their latency grows with the queue: the
signal a latency-based limiter reads), or it refuses (429 with Retry-After, at once, charging
nothing). `mode` picks one. The counts are reported by /healthz, so tests can see the queue
instead of timing it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any
from collections.abc import Iterator

QUEUE, REFUSE = "queue", "429"
MODES = (QUEUE, REFUSE)


class OverCapacity(Exception):
    """Refused: the account already has `capacity` requests in progress (429 mode)."""


class Capacity:
    def __init__(self, capacity: int | None, mode: str = QUEUE):
        if capacity is not None and capacity < 1:
            raise ValueError("capacity must be >= 1")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.capacity, self.mode = capacity, mode
        self._cond = threading.Condition()
        self._busy: dict[str, int] = {}     # account -> requests worked on
        self._waiting: dict[str, int] = {}  # account -> requests queued
        self.peak_in_progress = self.peak_queued = self.refused = 0

    @contextlib.contextmanager
    def slot(self, account: str) -> Iterator[None]:
        """Hold one of the account's places while the request is worked on; wait for one
        (queue mode) or raise OverCapacity (429 mode). No capacity: always at once."""
        capacity = self.capacity
        with self._cond:
            if capacity is not None and self._busy.get(account, 0) >= capacity:
                if self.mode == REFUSE:
                    self.refused += 1
                    raise OverCapacity()
                self._waiting[account] = self._waiting.get(account, 0) + 1
                self.peak_queued = max(self.peak_queued, sum(self._waiting.values()))
                self._cond.wait_for(lambda: self._busy.get(account, 0) < capacity)
                self._waiting[account] -= 1
            self._busy[account] = self._busy.get(account, 0) + 1
            self.peak_in_progress = max(self.peak_in_progress, self._busy[account])
        try:
            yield
        finally:
            with self._cond:
                self._busy[account] -= 1
                self._cond.notify_all()

    def report(self) -> dict[str, Any]:
        with self._cond:
            return {"capacity": self.capacity, "mode": self.mode,
                    "in_progress": sum(self._busy.values()), "queued": sum(self._waiting.values()),
                    "peak_in_progress": self.peak_in_progress, "peak_queued": self.peak_queued,
                    "refused": self.refused}

"""A progress line every few seconds while embedding: rows done/total, tokens, RUB, ETA."""
from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("embedpipe.progress")


class Progress:
    def __init__(self, interval_s: float, clock=time.monotonic):
        self._lock = threading.Lock()
        self._interval, self._clock = interval_s, clock
        self._start = self._last = clock()
        self.total_rows = 0
        self.rows = self.tokens = self.requests = 0
        self.cost_rub = 0.0

    def set_total(self, rows: int) -> None:
        self.total_rows = rows

    def add(self, rows: int, tokens: int, requests: int, cost_rub: float) -> None:
        with self._lock:
            self.rows += rows
            self.tokens += tokens
            self.requests += requests
            self.cost_rub += cost_rub
            now = self._clock()
            if now - self._last < self._interval:
                return
            self._last = now
            line = self.line(now)
        log.info(line)

    def line(self, now: float) -> str:
        elapsed = max(now - self._start, 1e-9)
        rate = self.rows / elapsed
        left = max(self.total_rows - self.rows, 0)
        eta = f"{left / rate:.0f}s" if rate > 0 else "?"
        total = self.total_rows or "?"
        return (f"embedded {self.rows}/{total} chunks, {self.tokens} tokens, {self.requests} requests, "
                f"{self.cost_rub:.6f} RUB, {rate:.0f} chunks/s, ETA {eta}")

"""How long an attempt waits for its answer: a read timeout that follows the service's latency,
within [read_timeout_s, read_timeout_max_s] (no Beam).

An attempt that times out was sent, so the service may bill it, and a retry may be billed
again: a short timeout against a slow service pays for nothing, twice. So:
- once answers came, an attempt waits `FACTOR` x the slowest of the last `WINDOW` answers (a
  queue that grows by a request or two per round trip stays under it), never less than the
  floor, never more than the ceiling;
- before any answer nothing says how long one takes: an attempt sent behind N of this
  process's requests may wait for all of them at a service that works on one at a time (a
  queue: a capacity of 1 at 20 s a request answers the 9th after 180 s), so it waits N x the
  floor, up to the ceiling;
- the one retry of an attempt that timed out waits the ceiling: waiting as long again would
  only be billed again (service/client.py sends no third).
The ceiling is also how long a service that stopped answering holds a request.
"""
from __future__ import annotations

import collections
import threading

FACTOR = 3.0   # x the slowest recent answer: slow start doubles the queue per round trip, a timeout
               # at 2x would cut the answers of the round trip that shows it
WINDOW = 64    # answers remembered: the slowest of them is the reference


class ReadTimeouts:
    """Thread-safe; one per worker process is best (it counts the process's requests in
    flight), one per client works."""

    def __init__(self, floor_s: float, ceiling_s: float):
        if not 0 < floor_s <= ceiling_s:
            raise ValueError(f"need 0 < read_timeout_s <= read_timeout_max_s, got {floor_s}, {ceiling_s}")
        self.floor_s, self.ceiling_s = float(floor_s), float(ceiling_s)
        self._recent: collections.deque = collections.deque(maxlen=WINDOW)
        self._in_flight = 0
        self._lock = threading.Lock()

    def first(self, in_flight: int = 1) -> float:
        """The timeout of a first attempt sent with IN_FLIGHT requests out (itself included)."""
        with self._lock:
            if not self._recent:
                return min(self.ceiling_s, self.floor_s * max(1, in_flight))
            return min(self.ceiling_s, max(self.floor_s, FACTOR * max(self._recent)))

    def after_timeout(self, previous_s: float) -> float | None:
        """The timeout of the one retry of an attempt that timed out after PREVIOUS_S; None
        when that was already the ceiling: no longer wait is allowed, and the same wait again
        would only be billed again."""
        return self.ceiling_s if previous_s < self.ceiling_s else None

    def observe(self, latency_s: float) -> None:
        """An answer (any HTTP status) came LATENCY_S after its attempt was sent."""
        with self._lock:
            self._recent.append(latency_s)

    def begin(self, retry_after_s: float | None = None) -> float:
        """An attempt leaves: its timeout (RETRY_AFTER_S: the one after_timeout gave). Call
        end() when it is over, answered or not."""
        with self._lock:
            self._in_flight += 1
            n = self._in_flight
        return retry_after_s if retry_after_s is not None else self.first(n)

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1

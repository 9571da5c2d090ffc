"""How long an attempt waits for its answer: a read timeout that follows the service's latency,
within [read_timeout_s, read_timeout_max_s] (no Beam).

An attempt that times out was sent, so the service may bill it, and a retry may be billed
again: a short timeout against a slow service pays for nothing, twice. Only answers (2xx) tell
how long the service works on a request: a refusal (429) or an error comes back at once, without
the work; taught by those, the timeout would fall to the floor while the service is busy, and a
request it then admits would time out and be billed twice. So an attempt waits:
- before any answer (2xx), the ceiling: nothing says how long one takes (61 s a request, or a queue:
  a capacity of 1 at 20 s a request answers the 9th request sent at once after 180 s);
- once answers came, sent with N of this process's requests out (itself included), `FACTOR` x
  the larger of the slowest of the last `WINDOW` answers and N x the longest time per request
  in flight they showed (latency / requests out when it was sent: at a queue, what each
  request ahead adds), never less than the floor (read_timeout_s), never more than the ceiling;
- after a timeout, the ceiling: waiting as long again would likely be billed again
  (service/client.py sends no third). The timeout counts as an answer that slow, for the
  attempts that follow.
So a service that stopped answering holds a request for twice the ceiling; once answers came,
for about the floor and then the ceiling.
"""
from __future__ import annotations

import collections
import threading
from typing import NamedTuple

FACTOR = 3.0   # x what the answers say: slow start doubles the queue per round trip, a timeout
               # at 2x would cut the answers of the round trip that shows it
WINDOW = 64    # answers remembered: the slowest of them is the reference


class Attempt(NamedTuple):
    timeout_s: float
    sent_with: int   # requests of the process out when it left, itself included


class ReadTimeouts:
    """Thread-safe; one per worker process is best (it counts the process's requests in
    flight), one per client works."""

    def __init__(self, floor_s: float, ceiling_s: float):
        if not 0 < floor_s <= ceiling_s:
            raise ValueError(f"need 0 < read_timeout_s <= read_timeout_max_s, got {floor_s}, {ceiling_s}")
        self.floor_s, self.ceiling_s = float(floor_s), float(ceiling_s)
        self._recent: collections.deque[tuple[float, float]] = collections.deque(maxlen=WINDOW)   # (latency, latency / sent_with)
        self._in_flight = 0
        self._lock = threading.Lock()

    def first(self, in_flight: int = 1) -> float:
        """The timeout of a first attempt sent with IN_FLIGHT requests out (itself included)."""
        n = max(1, in_flight)
        with self._lock:
            if not self._recent:
                return self.ceiling_s
            slowest = max(latency for latency, _ in self._recent)
            per_request = max(each for _, each in self._recent)
        return min(self.ceiling_s, max(self.floor_s, FACTOR * max(slowest, n * per_request)))

    def after_timeout(self, attempt: Attempt) -> float:
        """The timeout of the one retry of ATTEMPT, which timed out: the ceiling."""
        self._remember(attempt.timeout_s, attempt.sent_with)
        return self.ceiling_s

    def observe(self, status: int, latency_s: float, sent_with: int = 1) -> None:
        """An HTTP STATUS came LATENCY_S after its attempt left with SENT_WITH out: only an
        answer (2xx) teaches the timeout."""
        if 200 <= status < 300:
            self._remember(latency_s, sent_with)

    def _remember(self, latency_s: float, sent_with: int) -> None:
        with self._lock:
            self._recent.append((latency_s, latency_s / max(1, sent_with)))

    def begin(self, retry_s: float | None = None) -> Attempt:
        """An attempt leaves (RETRY_S: the timeout after_timeout gave its request). Call end()
        when it is over, answered or not."""
        with self._lock:
            self._in_flight += 1
            n = self._in_flight
        return Attempt(retry_s if retry_s is not None else self.first(n), n)

    def end(self) -> None:
        with self._lock:
            self._in_flight -= 1

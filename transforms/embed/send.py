"""Send one packed request and turn whatever happens into outcomes (no Beam here).

- over-length 400: a single input is re-split into smaller pieces and sent again; a batch is
  bisected until the over-length input stands alone;
- any other 400: bisect until the bad input stands alone, then dead-letter it;
- 401/403: trip the breaker: nothing more is sent by this worker, the rest is pending;
- 402 or a request that no longer fits the budget: stop spending, the rest is pending;
- transient faults that outlived the client's retry budget: the service is unreachable:
  trip the breaker too (a retry storm against a dead service helps nobody);
- an attempt sent without an answer (timed out, cut off, 5xx) may have been billed: the budget
  guard counts it as spent at the request's worst case before the retry goes, and the retry
  goes only if the budget still holds it (else the request is pending: budget);
- a request that timed out twice (the client's second attempt waits `read_timeout_max_s`): the
  service is slower than the run allows; both attempts may be billed, a third would be too:
  the breaker trips, the rest is pending (timed_out) and the message names the setting;
- 429s that outlived the client's refusals: the service is busy, not gone (more processes
  than it has places keep some out for a while): sent again after the Retry-After, for up to
  `max_refused_s` from its first such end, while this process gets answers; past that, the
  request is pending; a process without an answer for that long trips the breaker.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import random
import threading
import time
from typing import TYPE_CHECKING
from collections.abc import Callable, Sequence

import numpy as np

from service import errors
from service.client import EmbeddingsClient, backoff_delay
from transforms.embed.quota import TokenBucketLimiter
from transforms.embed.ratelimit import IGNORED, OK, RATE_LIMITED, ConcurrencyLimiter
from transforms.money.apportion import apportion_micro, from_micro, to_micro
from transforms.money.budget import BudgetGuard
from transforms.pending import Pending
from transforms.read.split import MIN_MAX_TOKENS, Splitter
from transforms.records import Rejected, TextItem

if TYPE_CHECKING:  # transforms/dedupe/known.py is a Beam step; this module needs only its record
    from transforms.dedupe.known import ReuseRef


# Inputs refused one by one with the same message, no success between: the request itself is
# wrong (a bad parameter, say), and bisecting on would pay nothing but send 2N-1 requests.
SAME_REFUSALS_TO_STOP = 3


class _RefusalStreak:
    def __init__(self):
        self._lock = threading.Lock()
        self._message, self._n = None, 0

    def count(self, message: str) -> int:
        with self._lock:
            self._n = self._n + 1 if message == self._message else 1
            self._message = message
            return self._n

    def reset(self) -> None:
        with self._lock:
            self._message, self._n = None, 0


class _Stopped(Exception):
    """Raised inside the runner when a request's turn (or its retry's) comes after the run
    stopped sending, or when its retry no longer fits the budget."""


@dataclasses.dataclass
class _Unanswered:
    """One request's attempts sent without an answer that the guard counted before their
    retries (each may have been billed), and how many of them timed out."""
    counted: int = 0
    timed_out: int = 0


class Breaker:
    """Once tripped, no request leaves this worker; the reason says why, once."""

    def __init__(self):
        self._lock = threading.Lock()
        self.reason: Pending | None = None
        self.message: str | None = None

    def trip(self, reason: Pending, message: str) -> bool:
        with self._lock:
            first = self.reason is None
            if first:
                self.reason, self.message = reason, message
            return first


@dataclasses.dataclass
class Delivery:
    """One answered request: its texts (each row carries the text sent for its vector; the
    journal keeps only their digests), their vectors and each text's share of the cost."""
    request_id: str | None   # None: a reused text whose file holds no request id
    items: list[TextItem]
    vectors: np.ndarray
    shares_micro: list[int]


@dataclasses.dataclass
class Outcome:
    deliveries: list[Delivery] = dataclasses.field(default_factory=list)
    requests: list[dict] = dataclasses.field(default_factory=list)
    failed: list[Rejected] = dataclasses.field(default_factory=list)
    pending: list[tuple[TextItem, Pending]] = dataclasses.field(default_factory=list)
    retries: int = 0
    timed_out: int = 0   # attempts that timed out after sending: each may have been billed


def request_key(run_id: str, model: str, dimensions: int | None, batch: Sequence[TextItem]) -> str:
    """The request id, derived from the run and what is sent: a retried bundle that packs the
    same texts finds the answer its earlier attempt paid for in the journal instead of paying
    again, while ids stay unique across runs."""
    h = hashlib.sha256(f"{run_id}|{model}|{dimensions}".encode())
    for sha in sorted(i.text_sha256 for i in batch):
        h.update(sha.encode())
    return h.hexdigest()[:32]


def _delivery_from_journal(request_id: str, batch: list[TextItem], row: dict, shas: list[str],
                           shares: list[int], vectors: np.ndarray) -> Delivery:
    position = {sha: i for i, sha in enumerate(shas)}
    order = [position[i.text_sha256] for i in batch]
    row["started_at"] = dt.datetime.fromisoformat(row["started_at"])
    return Delivery(request_id, batch, vectors[order], [shares[j] for j in order])


def rejections(item: TextItem, reason: str, detail: str) -> list[Rejected]:
    return [Rejected(r.doc_id, r.chunk_index, reason, detail) for r in item.refs]


class RequestRunner:
    def __init__(self, client: EmbeddingsClient, *, model: str, dimensions: int | None,
                 expected_dims: int, guard: BudgetGuard, breaker: Breaker, run_id: str,
                 resplit: Callable[[TextItem], list[TextItem]],
                 journal: Callable[[Delivery, dict], None] | None = None,
                 recall: Callable[[str], tuple[dict, list[str], list[int], np.ndarray] | None] | None = None,
                 intend: Callable[[str, int, int], None] | None = None,
                 concurrency: ConcurrencyLimiter | None = None, quota: TokenBucketLimiter | None = None,
                 known: Callable[[str], tuple[np.ndarray, ReuseRef] | None] | None = None,
                 max_refused_s: float = 0.0):
        self._client, self._model, self._dimensions = client, model, dimensions
        self._expected_dims = expected_dims
        self._guard, self._breaker, self._run_id = guard, breaker, run_id
        self._resplit, self._journal, self._recall, self._intend = resplit, journal, recall, intend
        self._concurrency, self._quota = concurrency, quota
        self._known = known
        self._max_refused_s = max_refused_s
        self._refused_since: dict[str, float] = {}   # request id -> when its refusals first ran out
        self._same_refusals = _RefusalStreak()

    def run(self, items: Sequence[TextItem]) -> Outcome:
        out = Outcome()
        queue = [list(items)]
        while queue:
            batch = queue.pop()
            if self._breaker.reason:
                out.pending += [(i, self._breaker.reason) for i in batch]
                continue
            queue += self._send(batch, out)
        return out

    def _send(self, batch: list[TextItem], out: Outcome) -> list[list[TextItem]]:
        """Send BATCH (or the part of it the budget allows; the rest is pending for good);
        return the sub-batches still to be sent (bisection, re-split)."""
        request_id = request_key(self._run_id, self._model, self._dimensions, batch)
        if self._recall is not None and (entry := self._recall(request_id)) is not None:
            out.deliveries.append(_delivery_from_journal(request_id, batch, *entry))
            out.requests.append(entry[0])
            return []
        n, reservation = self._guard.reserve_prefix([i.n_tokens for i in batch])
        out.pending += [(i, self._guard.stop_reason or Pending.BUDGET) for i in batch[n:]]
        if n == 0:
            return []
        if n < len(batch):
            batch = batch[:n]
            request_id = request_key(self._run_id, self._model, self._dimensions, batch)
        tokens = sum(i.n_tokens for i in batch)
        started = [dt.datetime.now(dt.UTC)]  # reset when it leaves, after waiting its turn
        unanswered = _Unanswered()
        try:
            result = self._embed([i.text for i in batch], tokens, request_id, reservation, started, unanswered)
        except _Stopped:  # the breaker tripped or spending stopped while this one waited its turn (or its retry's)
            self._guard.settle(reservation, None, None)   # what its attempts may cost is counted already
            out.timed_out += unanswered.timed_out
            out.pending += [(i, self._breaker.reason or self._guard.stop_reason or Pending.BUDGET) for i in batch]
            return []
        except errors.EmbeddingsError as exc:
            billed = getattr(exc, "usage", None)  # a malformed 200 was still billed
            self._guard.settle(reservation, billed.cost_rub if billed else None,
                               billed.balance if billed else None, exc.uncertain_attempts - unanswered.counted)
            out.retries += max(0, exc.attempts - 1)
            out.timed_out += exc.timed_out_attempts
            if self._refused_again(exc, request_id):
                out.retries += 1   # one logical request: the row is its last round's
                return [batch]
            out.requests.append(self._request_row(request_id, batch, started[0], error=exc))
            if isinstance(exc, errors.InvalidResponseError) and exc.base64_ignored:
                return [batch]  # the server ignored base64: the client now asks for floats
            return self._on_error(exc, batch, out)
        except BaseException:
            self._guard.settle(reservation, None, None)  # never leave a reservation behind
            raise
        self._guard.settle(reservation, result.usage.cost_rub, result.usage.balance,
                           result.uncertain_attempts - unanswered.counted)
        self._refused_since.pop(request_id, None)
        if result.usage.cost_rub is not None:
            self._guard.learn_price(result.usage.cost_rub, result.usage.total_tokens)
        row = self._request_row(request_id, batch, started[0], result=result)
        out.requests.append(row)
        out.retries += result.attempts - 1
        out.timed_out += result.timed_out_attempts
        if result.vectors.shape[1] != self._expected_dims:
            detail = (f"the service answered vectors of length {result.vectors.shape[1]}, "
                      f"expected {self._expected_dims} (request {request_id}, billed)")
            for item in batch:
                out.failed += rejections(item, "wrong_dimensions", detail)
            self._breaker.trip(Pending.INVALID, detail)  # every later answer would be paid for and thrown away
            return []
        total = to_micro(result.usage.cost_rub or 0.0)  # a server that reports no cost: lineage is 0
        delivery = Delivery(request_id, batch, result.vectors,
                            apportion_micro(total, [i.n_tokens for i in batch]))
        self._same_refusals.reset()
        if self._journal is not None:
            self._journal(delivery, row)
        out.deliveries.append(delivery)
        return []

    def _embed(self, texts: list[str], tokens: int, request_id: str, worst_case_micro: int,
               started: list[dt.datetime], unanswered: _Unanswered):
        """The call itself, paced by the client-side quota and the adaptive concurrency limit,
        which learns from every 429 (even one the client's retry loop absorbs), from the
        latency of each answer that took one attempt, and from the balance after each (whether
        others still spend on the account)."""
        if self._quota is not None:
            self._quota.acquire(tokens)
        count = functools.partial(self._count_unanswered, worst_case_micro, unanswered)
        if self._concurrency is None:
            self._check_running()
            self._announce(request_id, tokens, worst_case_micro, started)
            return self._client.embed(self._model, texts, dimensions=self._dimensions, request_id=request_id,
                                      on_unanswered=count)
        permit = self._concurrency.acquire()
        try:
            self._check_running()
            self._announce(request_id, tokens, worst_case_micro, started)
            result = self._client.embed(self._model, texts, dimensions=self._dimensions, request_id=request_id,
                                        on_retry=lambda status: permit.rate_limited() if status == 429 else None,
                                        on_timeout=lambda: self._after_timeout(permit), on_unanswered=count)
        except BaseException as exc:
            permit.release(RATE_LIMITED if getattr(exc, "status", None) == 429 else IGNORED)
            raise
        usage = result.usage
        permit.release(OK, tokens=tokens, latency_s=result.latency_ms / 1000 if result.attempts == 1 else None,
                       cost=None if usage.cost_rub is None else to_micro(usage.cost_rub),
                       balance=None if usage.balance is None else to_micro(usage.balance))
        return result

    def _count_unanswered(self, worst_case_micro: int, unanswered: _Unanswered, timed_out: bool) -> None:
        """An attempt got no answer and may have been billed: spent at the request's worst case
        for the guard before its retry goes; no retry if the budget no longer holds one."""
        unanswered.counted += 1
        unanswered.timed_out += timed_out
        if not self._guard.unanswered(worst_case_micro):
            raise _Stopped()

    def _after_timeout(self, permit) -> None:
        """Hold a timed-out request's retry until the limiter has a place; none if the run
        stopped sending meanwhile."""
        permit.timed_out()
        self._check_running()

    def _announce(self, request_id: str, tokens: int, worst_case_micro: int, started: list[dt.datetime]) -> None:
        if self._intend is not None:  # durable before the request leaves
            self._intend(request_id, tokens, worst_case_micro)
        # after the intent: started_at + latency_ms is when the answer came, which the
        # reconciliation orders charges by; before it, a slow write made that too early
        started[0] = dt.datetime.now(dt.UTC)

    def _check_running(self) -> None:
        if self._breaker.reason or self._guard.stop_reason:
            raise _Stopped()

    def _on_error(self, exc: errors.EmbeddingsError, batch: list[TextItem], out: Outcome):
        half = len(batch) // 2
        if isinstance(exc, errors.ContextLengthExceededError):
            if len(batch) > 1:
                return [batch[:half], batch[half:]]
            pieces = self._resplit(batch[0])
            if len(pieces) > 1:
                rest = self._unknown(pieces, out)
                return [rest] if rest else []
            out.failed += rejections(batch[0], "too_long", exc.message)
        elif isinstance(exc, errors.BadRequestError):
            if len(batch) > 1:
                return [batch[:half], batch[half:]]
            out.failed += rejections(batch[0], "bad_request", exc.message)
            if self._same_refusals.count(exc.message) >= SAME_REFUSALS_TO_STOP:
                self._breaker.trip(Pending.INVALID, f"the service refuses input after input with: {exc.message}")
        elif isinstance(exc, (errors.AuthenticationError, errors.PermissionDeniedError)):
            reason = Pending.UNAUTHORIZED if isinstance(exc, errors.AuthenticationError) else Pending.FORBIDDEN
            self._breaker.trip(reason, exc.message)
            out.pending += [(i, reason) for i in batch]
        elif isinstance(exc, errors.InsufficientBalanceError):
            self._guard.stop(Pending.BALANCE)
            out.pending += [(i, Pending.BALANCE) for i in batch]
        elif isinstance(exc, errors.InvalidResponseError):  # the service's fault, and maybe billed
            for item in batch:
                out.failed += rejections(item, "invalid_response", exc.message)
            self._breaker.trip(Pending.INVALID, exc.message)
        elif isinstance(exc, errors.APITimeoutError) and exc.timed_out_attempts:
            ceiling = self._client.retry.read_timeout_max_s
            self._breaker.trip(Pending.TIMED_OUT,
                               f"no answer within the read timeout, the last wait {ceiling:g} s "
                               "(client.read_timeout_max_s): the service is slower than that; "
                               f"{exc.timed_out_attempts} attempt{'s' * (exc.timed_out_attempts != 1)} "
                               "of one request timed out after sending and may have been billed")
            out.pending += [(i, Pending.TIMED_OUT) for i in batch]
        elif isinstance(exc, errors.RateLimitError) and self._answered_lately():
            out.pending += [(i, Pending.UNAVAILABLE) for i in batch]   # refused this long on its own: the others go on
        elif exc.retryable:
            refused = isinstance(exc, errors.RateLimitError) and self._concurrency is not None
            self._breaker.trip(Pending.UNAVAILABLE,
                               f"no answer for over {self._max_refused_s:g} s, every request refused "
                               f"(HTTP 429): {exc.message}" if refused else exc.message)
            out.pending += [(i, Pending.UNAVAILABLE) for i in batch]
        else:  # 404, 413 and other permanent statuses: this batch cannot succeed as sent
            if len(batch) > 1:
                return [batch[:half], batch[half:]]
            out.failed += rejections(batch[0], f"http_{exc.status or 'error'}", exc.message)
        return []

    def _answered_lately(self) -> bool:
        return self._concurrency is not None and self._concurrency.answered_within(self._max_refused_s)

    def _refused_again(self, exc: errors.EmbeddingsError, request_id: str) -> bool:
        """Whether a request the service refused (429) until the client's refusals ran out goes
        again, after the Retry-After: not if an attempt may have been billed, nor past
        `max_refused_s` from its first such end, nor once this process has gone that long
        without an answer."""
        if not isinstance(exc, errors.RateLimitError) or exc.uncertain_attempts:
            return False
        first = self._refused_since.setdefault(request_id, time.monotonic())
        if time.monotonic() - first >= self._max_refused_s or not self._answered_lately():
            del self._refused_since[request_id]
            return False
        retry = self._client.retry   # the client's wait, jitter included: processes do not come back together
        time.sleep(min(backoff_delay(retry, 1, exc.retry_after, random.random()), retry.max_backoff_s))
        return True

    def _unknown(self, pieces: list[TextItem], out: Outcome) -> list[TextItem]:
        """The pieces of a re-split text that no store holds; the others are delivered from
        where they were paid (a run killed after paying for some is resumed without paying
        them again)."""
        if self._known is None:
            return pieces
        rest = []
        for piece in pieces:
            known = self._known(piece.text_sha256)
            if known is None:
                rest.append(piece)
            else:
                vector, ref = known
                out.deliveries.append(Delivery(ref.request_id, [piece], vector.reshape(1, -1), [ref.share_micro]))
        return rest

    def _request_row(self, request_id, batch, started, *, result=None, error=None) -> dict:
        usage = result.usage if result is not None else getattr(error, "usage", None)
        return {
            "request_id": request_id, "model": self._model, "n_inputs": len(batch),
            "prompt_tokens": usage.prompt_tokens if usage else 0,
            "total_tokens": usage.total_tokens if usage else 0,
            "cost_rub": from_micro(to_micro(usage.cost_rub or 0.0)) if usage else 0.0,
            "balance_after": usage.balance if usage else None,
            "attempts": result.attempts if result is not None else error.attempts,
            "latency_ms": (result or error).latency_ms,
            "status": result.status if result is not None else (error.status or 0),
            "started_at": started, "run_id": self._run_id,
        }


def resplit(item: TextItem, splitter_for: Callable[[int], Splitter]) -> list[TextItem]:
    """Cut an input the service found too long into halves (by client tokens). The pieces keep
    the parent's chunk_index; their token spans tell them apart and give their order."""
    if item.n_tokens // 2 < MIN_MAX_TOKENS:
        return [item]  # too short to halve: the caller dead-letters it as too_long
    pieces = splitter_for(item.n_tokens // 2).split("", item.text)
    return [TextItem(p.text_sha256, p.text, p.n_tokens, tuple(
                r._replace(token_start=r.token_start + p.token_start,
                           token_end=r.token_start + p.token_end, n_tokens=p.n_tokens)
                for r in item.refs))
            for p in pieces]

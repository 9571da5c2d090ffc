"""Sending packed requests from one worker process, for the Embed step (transform.py) and the
library's ServiceTextEmbeddings alike: the client, the budget guard, breaker and rate limiters
every sender of a run in the process shares, and the request runner wired to where answers
are kept: DIR's journal, or the store of paid texts, whose entries are the same journal's.
Either way each request's entry takes its space and its intent is written before it leaves.
No Beam here."""
from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

from service.timeouts import ReadTimeouts
from service.tokenizer import get_encoding
from transforms.dedupe.known import ReuseRef, known_vector
from transforms.dedupe.store import PaidStore
from transforms.embed.config import EmbedConfig
from transforms.embed.quota import TokenBucketLimiter
from transforms.embed.ratelimit import ConcurrencyLimiter
from transforms.embed.send import Breaker, Outcome, RequestRunner, resplit
from transforms.money import journal
from transforms.money.budget import BudgetGuard
from transforms.money.caps import AccountWatch
from transforms.read.split import SplitConfig, Splitter
from transforms.worker import runscoped


@dataclasses.dataclass
class Shared:
    """What every DoFn instance of one worker process shares for a run: one budget guard,
    breaker and pair of rate limiters (the provider's limits are per key, not
    per thread)."""
    guard: BudgetGuard
    breaker: Breaker
    concurrency: ConcurrencyLimiter
    quota: TokenBucketLimiter
    timeouts: ReadTimeouts   # learnt from every client's answers, counting every request in flight
    breaker_logged: bool = False
    reported: dict = dataclasses.field(default_factory=dict)   # limiter figures in the counters
    _mutex: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    @classmethod
    def for_run(cls, cfg: EmbedConfig) -> Shared:
        return runscoped.shared(cfg.output.run_id, "embed", lambda: cls._build(cfg))

    @classmethod
    def _build(cls, cfg: EmbedConfig) -> Shared:
        service, budget = cfg.service, cfg.budget
        # account readings use a client of their own that tries once: a 429 only delays them
        once = dataclasses.replace(service.retry, max_attempts=1, max_refusals=0)
        watch = AccountWatch(service.client(retry=once, pool_size=1), budget.poll_s, with_stats=budget.has_caps)
        return cls(budget.guard(watch.read), Breaker(),
                   ConcurrencyLimiter(min(service.initial_in_flight, service.max_in_flight),
                                      maximum=service.max_in_flight, admitted_after_s=service.admitted_after_s),
                   TokenBucketLimiter(service.requests_per_minute, service.tokens_per_minute),
                   ReadTimeouts(service.retry.read_timeout_s, service.retry.read_timeout_max_s))

    def limit_changes(self) -> list[tuple[str, int]]:
        """What the limiter's figures moved since the last report: counters summed over bundles
        and processes (in summary.json's metrics: the limits of all processes added up)."""
        lim = self.concurrency
        now = {"in_flight_limit": lim.settled, "in_flight_peak": int(lim.peak), "limit_decreases": lim.decreases,
               "latency_decreases": lim.latency_decreases, "limit_drains": lim.drains,
               "rate_limited": lim.rate_limited_count, "others_left": lim.others_left}
        with self._mutex:
            changes = [(k, v - self.reported.get(k, 0)) for k, v in now.items() if v != self.reported.get(k, 0)]
            self.reported.update(now)
        return changes


RESPLIT_PIECES = 3  # a text the service finds too long goes again as at most this many pieces (send.resplit)


class Sender:
    """CFG's requests from this process: run(request) -> Outcome, each answer kept as soon as it
    is paid (CFG.output's DIR, or CFG.store)."""

    def __init__(self, cfg: EmbedConfig):
        service, out = cfg.service, cfg.output
        self.shared = shared = Shared.for_run(cfg)
        self._cfg, self.client = cfg, service.client(timeouts=shared.timeouts)
        self._thread = threading.local()   # the request a pool thread works on: its journal space
        self.store = (PaidStore.shared(cfg.store, service.model, service.expected_dims, out.run_id)
                      if cfg.store else None)
        # where entries and intents go: the store's location (None when it is only read), or DIR
        self._journal_at = self.store.spec.path if self.store is not None else out.output_dir
        encoding = get_encoding()
        self.runner = RequestRunner(
            self.client, model=service.model, dimensions=service.dimensions, expected_dims=service.expected_dims,
            guard=shared.guard, breaker=shared.breaker, run_id=out.run_id,
            resplit=lambda item: resplit(item, lambda n: Splitter(encoding, SplitConfig(
                max_tokens=n, boundary_window=cfg.boundary_window))),
            concurrency=shared.concurrency, quota=shared.quota if shared.quota.enabled else None,
            max_refused_s=service.max_refused_s,
            **(self._store_calls(self.store) if self.store is not None else self._dir_calls()))

    def _dir_calls(self) -> dict:
        """The journal, intents and known texts of the CLI's DIR (none without one)."""
        out, stores = self._cfg.output, self._cfg.known
        calls = {"known": (lambda sha: known_vector(stores, sha)) if stores and stores.any else None}
        if out.output_dir is None:
            return calls
        return {**calls, "journal": self._journal,
                "recall": lambda request_id: journal.read_entry(self._at, out.run_id, request_id),
                "intend": self._intend}

    def _store_calls(self, store: PaidStore) -> dict:
        """The same through the store of paid texts."""
        run_id = self._cfg.output.run_id

        def known(sha: str):
            found = store.lookup([sha]).get(sha)
            return None if found is None else (found.vector, ReuseRef("", 0, 0, found.request_id, 0, False))

        return {"journal": lambda d, row: store.put(row, [i.text_sha256 for i in d.items],
                                                    [i.n_tokens for i in d.items], d.vectors, d.shares_micro),
                "recall": lambda request_id: store.recall(run_id, request_id),
                "intend": self._intend if self._journal_at else None, "known": known}

    @property
    def _at(self) -> str:
        """Where entries and intents go (DIR, or the store), which every call using it has."""
        if self._journal_at is None:
            raise RuntimeError("the journal used without a location")
        return self._journal_at

    def _intend(self, request_id: str, tokens: int, worst_case_micro: int) -> None:
        """Before REQUEST_ID leaves: its entry's space in the journal (DIR's or the store's), then
        its intent. A full disk raises here, before anything is paid."""
        run_id = self._cfg.output.run_id
        rows = min(tokens, getattr(self._thread, "rows", tokens))   # an input has a token at least
        journal.reserve(self._at, run_id, request_id, journal.entry_bytes(rows, self._cfg.service.expected_dims))
        getattr(self._thread, "reserved", []).append(request_id)
        journal.write_intent(self._at, run_id, request_id, tokens, worst_case_micro)

    def _journal(self, delivery, request_row) -> None:
        out = self._cfg.output
        journal.write_entry(self._at, out.run_id, request_row,
                            [i.text_sha256 for i in delivery.items], [i.n_tokens for i in delivery.items],
                            delivery.vectors, delivery.shares_micro)

    def run(self, request: Sequence) -> Outcome:
        """One request (thread-safe). The journal space its requests reserve is bounded by its
        inputs (a part of them each, or a re-split text's pieces); what a request that got no
        entry reserved is given back."""
        self._thread.rows, self._thread.reserved = max(len(request), RESPLIT_PIECES), []
        try:
            return self.runner.run(request)
        finally:
            if self._thread.reserved:
                journal.release(self._at, self._cfg.output.run_id, self._thread.reserved)

    def close(self) -> None:
        self.client.close()

"""Embed: packed requests -> embeddings tables, with requests / failed / pending tagged outputs.

The DoFn builds its client in setup() and keeps requests in flight with a thread pool, as many
as the process's adaptive limit allows (transforms/embed/ratelimit.ConcurrencyLimiter, at most
`max_in_flight`): requests is blocking and releases the GIL while waiting, and threads need no
new dependency (asyncio would need an async HTTP client). Budget guard and breaker are shared
by every DoFn instance of one worker process.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import datetime as dt
import logging
import threading
from typing import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from service.timeouts import ReadTimeouts
from service.tokenizer import get_encoding
from transforms.dedupe.known import known_vector
from transforms.embed.config import EmbedConfig
from transforms.embed.quota import TokenBucketLimiter
from transforms.embed.ratelimit import ConcurrencyLimiter
from transforms.embed.send import PREFLIGHT, Breaker, Outcome, RequestRunner, resplit
from transforms.money import journal
from transforms.money.budget import BudgetGuard
from transforms.money.caps import AccountWatch
from transforms.money.lineage import embeddings_table, pending_table
from transforms.read.split import SplitConfig, Splitter
from transforms.worker import coders, collector, runscoped  # noqa: F401  (coders: the coder of pa.Table)
from transforms.worker.progress import Progress

log = logging.getLogger("embedpipe.embed")

REQUESTS, FAILED, PENDING = "requests", "failed", "pending"
_RECHECK_S = 0.05   # how often a reader waiting for a place looks at the limit again


@dataclasses.dataclass
class _Shared:
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
    def for_run(cls, cfg: EmbedConfig) -> "_Shared":
        return runscoped.shared(cfg.output.run_id, "embed", lambda: cls._build(cfg))

    @classmethod
    def _build(cls, cfg: EmbedConfig) -> "_Shared":
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


class _EmbedDoFn(beam.DoFn):
    def __init__(self, cfg: EmbedConfig):
        self._cfg = cfg
        self._m = {name: Metrics.counter("embedpipe", name) for name in (
            "requests", "embedded_chunks", "tokens", "cost_micro_rub", "retries", "failed_chunks",
            "pending_chunks", "timed_out_attempts", "in_flight_limit", "in_flight_peak", "limit_decreases", "latency_decreases",
            "limit_drains", "rate_limited", "others_left")}

    def setup(self):
        collector.tune_once()
        cfg, service, out = self._cfg, self._cfg.service, self._cfg.output
        self._shared = shared = _Shared.for_run(cfg)
        self._client = service.client(timeouts=shared.timeouts)
        # no output directory (the library's EmbedTexts): no journal, no progress files
        durable = out.output_dir is not None
        self._progress = Progress.for_run(out.output_dir, out.run_id, out.progress_interval_s) if durable else None
        encoding = get_encoding()
        self._runner = RequestRunner(
            self._client, model=service.model, dimensions=service.dimensions, expected_dims=service.expected_dims,
            guard=shared.guard, breaker=shared.breaker, run_id=out.run_id,
            resplit=lambda item: resplit(item, lambda n: Splitter(encoding, SplitConfig(
                max_tokens=n, boundary_window=cfg.boundary_window))),
            journal=self._journal if durable else None,
            recall=(lambda request_id: journal.read_entry(out.output_dir, out.run_id, request_id)) if durable else None,
            intend=(lambda request_id, tokens, worst: journal.write_intent(out.output_dir, out.run_id, request_id,
                                                                           tokens, worst)) if durable else None,
            concurrency=shared.concurrency, quota=shared.quota if shared.quota.enabled else None,
            known=(lambda sha: known_vector(cfg.known, sha)) if cfg.known and cfg.known.any else None,
            max_refused_s=service.max_refused_s)
        self._pool = cf.ThreadPoolExecutor(service.max_in_flight + 1, thread_name_prefix="embed")

    def start_bundle(self):
        # Requests of a bundle that failed may still be running: let them finish (their answers
        # are journaled, so a retry finds them) before anything is sent again.
        cf.wait(getattr(self, "_futures", ()))
        self._futures: set[cf.Future] = set()

    def process(self, request: Sequence):
        if not self._cfg.budget.fits:  # the preflight said no (and no --allow-partial): send nothing
            yield from self._emit(Outcome(pending=[(item, PREFLIGHT) for item in request]))
            return
        self._shared.guard.poll()  # balance, key budget, stats: now and then, within their rate limit
        # Answers are written out as soon as this thread comes by: each holds its vectors until
        # then. One request more than may be in flight waits ready for the next place; more
        # (twice the limit) cost ~140 MB at 20k documents for no speed: each holds its text.
        # The limit also grows with no answer (the ramp before the first one): look again often
        done = {fut for fut in self._futures if fut.done()}
        while len(self._futures) - len(done) > self._shared.concurrency.allowed:
            done |= cf.wait(self._futures - done, timeout=_RECHECK_S, return_when=cf.FIRST_COMPLETED).done
        self._futures -= done
        for fut in done:
            yield from self._emit(fut.result())
        self._futures.add(self._pool.submit(self._runner.run, request))

    def finish_bundle(self):
        for fut in cf.as_completed(self._futures):
            for out in self._emit(fut.result()):
                tag, value = (out.tag, out.value) if isinstance(out, beam.pvalue.TaggedOutput) else (None, out)
                wv = WindowedValue(value, MIN_TIMESTAMP, [GlobalWindow()])
                yield beam.pvalue.TaggedOutput(tag, wv) if tag else wv
        self._futures = set()
        if self._progress:
            self._progress.flush()
        for name, change in self._shared.limit_changes():
            self._m[name].inc(change)

    def teardown(self):
        if getattr(self, "_pool", None):
            self._pool.shutdown(wait=True)
            self._client.close()

    def _journal(self, delivery, request_row):
        out = self._cfg.output
        journal.write_entry(out.output_dir, out.run_id, request_row,
                            [i.text_sha256 for i in delivery.items], [i.n_tokens for i in delivery.items],
                            delivery.vectors, delivery.shares_micro)

    def _emit(self, outcome: Outcome):
        out, now = self._cfg.output, dt.datetime.now(dt.timezone.utc)
        rows = tokens = 0
        for d in outcome.deliveries:
            table = embeddings_table(d.items, d.vectors, [d.request_id] * len(d.items), d.shares_micro,
                                     out.embeddings_schema, self._cfg.service.model, out.run_id, out.kept, now)
            rows += table.num_rows
            tokens += sum(i.n_tokens for i in d.items)
            yield table
        cost = sum(r["cost_rub"] for r in outcome.requests)
        for row in outcome.requests:
            yield beam.pvalue.TaggedOutput(REQUESTS, row)
        for rejected in outcome.failed:
            yield beam.pvalue.TaggedOutput(FAILED, rejected)
        if outcome.pending:
            yield beam.pvalue.TaggedOutput(PENDING, pending_table(
                outcome.pending, out.pending_schema, self._cfg.service.model, out.run_id, out.kept))
        m = self._m
        m["requests"].inc(len(outcome.requests))
        m["embedded_chunks"].inc(rows)
        m["tokens"].inc(tokens)
        m["cost_micro_rub"].inc(round(cost * 1e6))
        m["retries"].inc(outcome.retries)
        m["timed_out_attempts"].inc(outcome.timed_out)
        m["failed_chunks"].inc(len(outcome.failed))
        m["pending_chunks"].inc(sum(len(i.refs) for i, _ in outcome.pending))
        if self._progress:
            self._progress.add(chunks=rows, tokens=tokens, requests=len(outcome.requests),
                               cost_micro=round(cost * 1e6))
        shared = self._shared
        if shared.breaker.reason and not shared.breaker_logged:
            shared.breaker_logged = True
            log.error("stopped sending: %s (%s)", shared.breaker.reason, shared.breaker.message)


class EmbedRequests(beam.PTransform):
    """Packed requests -> main: embeddings tables; tagged requests (dicts), failed (Rejected),
    pending (tables)."""

    def __init__(self, cfg: EmbedConfig):
        super().__init__()
        self._cfg = cfg

    def expand(self, requests):
        return requests | "Embed" >> beam.ParDo(_EmbedDoFn(self._cfg)).with_output_types(pa.Table).with_outputs(
            REQUESTS, FAILED, PENDING, main="embeddings")


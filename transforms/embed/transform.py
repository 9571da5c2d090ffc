"""Embed: packed requests -> embeddings tables, with requests / failed / pending tagged outputs.

The DoFn builds its Sender in setup() (sender.py: client, runner, and the budget guard,
breaker and limiters every DoFn instance of one worker process shares) and keeps requests in
flight with a thread pool, as many as the process's adaptive limit allows
(transforms/embed/ratelimit.ConcurrencyLimiter, at most `max_in_flight`): requests is blocking
and releases the GIL while waiting, and threads need no new dependency (asyncio would need an
async HTTP client). Batches of StoredItems are the store's vectors, paid already.

The library's claims (EmbedConfig.claims, transforms/dedupe/inflight.py) are sealed here, right
before a request is submitted, and settled when it ends, or at once if it never left: rows
that wait for a text in flight wait for exactly that, so no path may skip the settle.
"""
from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import logging
from collections.abc import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from transforms.dedupe.inflight import InFlightClaims, stored_outcome
from transforms.embed.config import EmbedConfig
from transforms.embed.send import Outcome
from transforms.embed.sender import Sender
from transforms.money.lineage import embeddings_table, pending_table
from transforms.pending import Pending
from transforms.records import Request, StoredItem
from transforms.worker import coders, collector  # noqa: F401  (coders: the coder of pa.Table)
from transforms.worker.progress import Progress

log = logging.getLogger("embedpipe.embed")

REQUESTS, FAILED, PENDING = "requests", "failed", "pending"
_RECHECK_S = 0.05   # how often a reader waiting for a place looks at the limit again


class _EmbedDoFn(beam.DoFn):
    def __init__(self, cfg: EmbedConfig):
        self._cfg = cfg
        self._m = {name: Metrics.counter("embedpipe", name) for name in (
            "requests", "embedded_chunks", "tokens", "cost_micro_rub", "retries", "failed_chunks",
            "pending_chunks", "timed_out_attempts", "in_flight_limit", "in_flight_peak", "limit_decreases",
            "latency_decreases", "limit_drains", "rate_limited", "others_left")}

    def setup(self):
        collector.tune_once()
        out = self._cfg.output
        self._sender = Sender(self._cfg)
        self._shared = self._sender.shared
        # no output directory (the library's EmbedTexts): no progress files
        self._progress = (Progress.for_run(out.output_dir, out.run_id, out.progress_interval_s)
                          if out.output_dir is not None else None)
        self._pool = cf.ThreadPoolExecutor(self._cfg.service.max_in_flight + 1, thread_name_prefix="embed")
        self._claims = InFlightClaims.for_run(self._cfg.claims) if self._cfg.claims else None

    def start_bundle(self):
        # Requests of a bundle that failed may still be running: let them finish (their answers
        # are journaled, so a retry finds them) before anything is sent again.
        cf.wait(getattr(self, "_futures", ()))
        self._futures: set[cf.Future] = set()

    def process(self, request: Request):
        if isinstance(request[0], StoredItem):   # vectors the store holds: paid already
            assert self._sender.store is not None   # only a store's Dedupe makes StoredItems
            hits, vectors, request_ids, lost = stored_outcome(self._sender.store, request)
            yield from self._emit(Outcome(pending=lost), [(hits, vectors, request_ids)])
            return
        if self._progress:
            self._progress.add(planned=1)
        if not self._cfg.budget.fits:  # the preflight said no (and no --allow-partial): send nothing
            request, sent = self._seal(request)
            self._settle(sent)
            yield from self._emit(Outcome(pending=[(item, Pending.PREFLIGHT) for item in request]))
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
        self._futures.add(self._submit(request))
        for fut in done:
            yield from self._emit(fut.result())

    def _seal(self, request: Request) -> tuple[Request, list[bytes]]:
        return self._claims.seal(request) if self._claims is not None else (request, [])

    def _settle(self, sent: list[bytes]) -> None:
        if sent and self._claims is not None:
            self._claims.settle(sent)

    def _submit(self, request: Request) -> cf.Future:
        """REQUEST sealed (its claims' rows with it) and in the pool; its claims settled when it
        ends, or here if it never left."""
        request, sent = self._seal(request)
        try:
            return self._pool.submit(self._run, request, sent)
        except BaseException:
            self._settle(sent)
            raise

    def _run(self, request: Sequence, sent: list) -> Outcome:
        try:
            return self._sender.run(request)
        finally:
            self._settle(sent)

    def finish_bundle(self):
        for fut in cf.as_completed(self._futures):
            for out in self._emit(fut.result()):
                tag, value = (out.tag, out.value) if isinstance(out, beam.pvalue.TaggedOutput) else (None, out)
                wv = WindowedValue(value, MIN_TIMESTAMP, (GlobalWindow(),))
                yield beam.pvalue.TaggedOutput(tag, wv) if tag else wv
        self._futures = set()
        if self._progress:
            self._progress.flush()
        for name, change in self._shared.limit_changes():
            self._m[name].inc(change)

    def teardown(self):
        if getattr(self, "_pool", None):
            self._pool.shutdown(wait=True)
            self._sender.close()

    def _emit(self, outcome: Outcome, stored: Sequence = ()):
        out, now = self._cfg.output, dt.datetime.now(dt.UTC)
        rows = tokens = reused = 0
        for d in outcome.deliveries:
            table = embeddings_table(d.items, d.vectors, [d.request_id] * len(d.items), d.shares_micro,
                                     out.embeddings_schema, self._cfg.service.model, out.run_id, out.kept, now)
            rows += table.num_rows
            tokens += sum(i.n_tokens for i in d.items)
            yield table
        for items, vectors, request_ids in stored:   # paid before: cost 0, the request that paid named
            if items:
                table = embeddings_table(items, vectors, request_ids, [0] * len(items), out.embeddings_schema,
                                         self._cfg.service.model, out.run_id, out.kept, now)
                reused += table.num_rows
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
        m["failed_chunks"].inc(len(outcome.failed))
        m["pending_chunks"].inc(sum(len(i.refs) for i, _ in outcome.pending))
        m["timed_out_attempts"].inc(outcome.timed_out)
        if self._progress:
            self._progress.add(answered=int(bool(outcome.requests)), chunks=rows + reused, tokens=tokens,
                               requests=len(outcome.requests), cost_micro=round(cost * 1e6))
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


"""A model-based test of EmbedTexts's claims and its store of paid texts (hypothesis' stateful
testing): two pipelines on one store, each in a worker process of its own, run bundles that
fail and are retried, processes that die (one after paying for a request and before keeping
its answer), compactions and refreshes, in random interleavings, against a real sandbox over
HTTP (its ledger is what was billed; a request takes a few milliseconds there, so the real
thing keeps ~30 examples within seconds and no fake of the sender is needed).

The stage is driven as Beam's SDK harness drives it (tests/library/bundles.py); each process's
process-wide objects (runscoped) are its own, swapped in while it runs. A rule returns once the
requests it started have ended (their outcomes not yet emitted), so the ledger says which
rule paid what. Invariants:
- every input row ends in exactly one output of the bundles that succeeded (here: embedded,
  with the sandbox's vector of its text): none lost, none twice, none `duplicate_id`;
- a process pays a text at most once, and only if it read a row of it while no answer of it
  was in the store at its last listing: a text is paid more than once only where another
  process paid it after this one listed the store (or claimed it), or a process died after
  paying it, before keeping it.
"""
from __future__ import annotations

import concurrent.futures as cf
import contextlib
import dataclasses
import hashlib
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from embedpipe._config import resolve
from service.credentials import KeySource
from service.sandbox.embedder import embed_text
from tests.conftest import SANDBOX_KEY
from tests.library.bundles import MODEL, Bundle, Processor, library_fns, rows_of
from transforms.dedupe.compaction import compact
from transforms.dedupe.store import SCOPE, PaidStore, StoreSpec
from transforms.worker import runscoped

TEXTS = [f"text {i}: " + "words " * (3 + i) for i in range(6)]
DIMS = 1536


class _Died(BaseException):
    """The process is gone (SIGKILL): raised where its answer would have been kept."""


@dataclasses.dataclass
class Process:
    """One incarnation of a pipeline's worker process."""
    number: int
    registry: dict = dataclasses.field(default_factory=dict)   # its runscoped objects
    processor: Processor | None = None                         # reused after a bundle that succeeded
    listed: set = dataclasses.field(default_factory=set)       # texts stored at its last listing, or paid by it
    unlisted: set = dataclasses.field(default_factory=set)     # texts it read while its listing had none
    paid: set = dataclasses.field(default_factory=set)         # texts billed for its requests
    lost: set = dataclasses.field(default_factory=set)         # of those, texts it died before keeping
    die_when_paid: bool = False
    dead: bool = False                                         # sends nothing more

    @property
    def store(self):
        return self.registry[SCOPE][next(iter(self.registry[SCOPE]))]


@dataclasses.dataclass
class Pipeline:
    name: str
    fns: list
    rows: list[dict]
    process: Process
    done: dict = dataclasses.field(default_factory=dict)       # id -> its outputs, from bundles that succeeded
    bundle: Bundle | None = None
    attempt: list = dataclasses.field(default_factory=list)    # the rows of the bundle being run
    pushed: int = 0
    retry: list = dataclasses.field(default_factory=list)      # rows of a bundle that failed: the next bundle's

    def waiting(self) -> list[dict]:
        busy = {r["id"] for r in self.attempt + self.retry}
        return [r for r in self.rows if r["id"] not in self.done and r["id"] not in busy]


class Claims(RuleBasedStateMachine):
    sandbox = None   # set by the test
    root = None
    budget = None
    _numbers = itertools.count()

    def __init__(self):
        super().__init__()
        n = next(self._numbers)
        self.store = str(self.root / f"store-{n}")
        self.seen = len(self.sandbox.ledger())
        self.sent_by: dict[str, Process] = {}   # request id -> the process that sent it
        self.stored: set[str] = set()           # texts whose answers the store keeps
        self.pipelines: list[Pipeline] = []
        self.processes = itertools.count()

    @initialize(a=st.lists(st.sampled_from(TEXTS), min_size=2, max_size=8),
                b=st.lists(st.sampled_from(TEXTS), min_size=2, max_size=8))
    def pipelines_on_one_store(self, a, b):
        for name, texts in (("a", a), ("b", b)):
            fns, _ = library_fns(self.sandbox.base_url, self.store, max_inputs=2, budget=self.budget,
                                 run_id=f"{self.store.rsplit('/', 1)[1]}-{name}")
            rows = [{"id": f"{name}{i}", "text": t} for i, t in enumerate(texts)]
            self.pipelines.append(Pipeline(name, fns, rows, self._process()))

    def _process(self) -> Process:
        return Process(next(self.processes))

    @contextlib.contextmanager
    def _in(self, pipeline: Pipeline):
        """Run as PIPELINE's worker process; then check and keep what it paid."""
        process = pipeline.process
        saved, runscoped._by_run = runscoped._by_run, process.registry
        try:
            yield process
        finally:
            runscoped._by_run = saved
            self._account()
            self.stored |= process.paid - process.lost   # kept in the store, and in its index
            process.listed |= process.paid

    def _account(self) -> None:
        ledger = self.sandbox.ledger()
        for charge in ledger[self.seen:]:
            process = self.sent_by[charge["request_id"]]
            for sha in charge["input_sha256"]:
                assert sha in process.unlisted and sha not in process.paid, \
                    f"process {process.number} paid for a text it held or had paid"
                process.paid.add(sha)
        self.seen = len(ledger)

    # -- the process's stage -------------------------------------------------------------------

    def _processor(self, pipeline: Pipeline) -> Processor:
        process = pipeline.process
        if process.processor is None:
            fresh = not process.registry
            process.processor = Processor(pipeline.fns)
            embed = process.processor.fns[-1]
            embed._sender.client.embed = self._recording(embed._sender.client.embed, process)
            if fresh:   # a process lists the store when it first uses it
                process.listed = set(self.stored)
                put = process.store.put
                process.store.put = lambda *a, **k: self._put(process, put, *a, **k)
        return process.processor

    def _recording(self, embed, process: Process):
        def recording(*args, request_id, **kwargs):
            if process.dead:
                raise _Died()
            self.sent_by[request_id] = process
            return embed(*args, request_id=request_id, **kwargs)
        return recording

    def _put(self, process: Process, put, request_row, shas, *args):
        if process.die_when_paid:
            process.dead = True
            process.lost |= set(shas)
            raise _Died()
        return put(request_row, shas, *args)

    def _push(self, pipeline: Pipeline, rows: list[dict]) -> None:
        process = pipeline.process
        process.unlisted |= {sha for r in rows if (sha := hashlib.sha256(r["text"].encode()).hexdigest())
                             not in process.listed}
        pipeline.pushed += len(rows)
        pipeline.bundle.push(rows)

    def _settled(self, pipeline: Pipeline) -> None:
        """Wait until the requests the bundle started have ended (their outcomes not emitted yet)."""
        if pipeline.process.processor is not None:
            cf.wait(getattr(pipeline.process.processor.fns[-1], "_futures", ()))

    @precondition(lambda self: any(p.bundle is None and (p.retry or p.waiting()) for p in self.pipelines))
    @rule(data=st.data(), size=st.integers(1, 4))
    def start_bundle(self, data, size):
        pipeline = data.draw(st.sampled_from([p for p in self.pipelines if p.bundle is None
                                              and (p.retry or p.waiting())]))
        pipeline.attempt = pipeline.retry or pipeline.waiting()[:size]
        pipeline.retry, pipeline.pushed = [], 0
        with self._in(pipeline):
            pipeline.bundle = self._processor(pipeline).bundle()

    def _running(self):
        return [p for p in self.pipelines if p.bundle is not None]

    @precondition(lambda self: any(p.bundle is not None and p.pushed < len(p.attempt) for p in self.pipelines))
    @rule(data=st.data(), n=st.integers(1, 3))
    def push(self, data, n):
        pipeline = data.draw(st.sampled_from([p for p in self._running() if p.pushed < len(p.attempt)]))
        rows = pipeline.attempt[pipeline.pushed:pipeline.pushed + n]
        with self._in(pipeline):
            self._push(pipeline, rows)
            self._settled(pipeline)

    @precondition(lambda self: bool(any(p.bundle is not None for p in self.pipelines)))
    @rule(data=st.data())
    def finish_bundle(self, data):
        self._finish(data.draw(st.sampled_from(self._running())))

    def _finish(self, pipeline: Pipeline) -> None:
        with self._in(pipeline):
            self._push(pipeline, pipeline.attempt[pipeline.pushed:])
            out = rows_of(pipeline.bundle.finish())
        ids = {r["id"] for r in pipeline.attempt}
        assert out["failed"] == [] and out["pending"] == [], out   # duplicate_id, store_changed: none here
        assert sorted(d for d, _ in out["embeddings"]) == sorted(ids), out
        assert not ids & pipeline.done.keys()
        for table in pipeline.bundle.out["embeddings"]:
            for row in table.to_pylist():
                text = next(r["text"] for r in pipeline.rows if r["id"] == row["doc_id"])
                assert np.allclose(row["embedding"], embed_text(MODEL, text, DIMS), atol=1e-6)
                pipeline.done[row["doc_id"]] = row
        pipeline.bundle, pipeline.attempt = None, []

    @precondition(lambda self: bool(any(p.bundle is not None for p in self.pipelines)))
    @rule(data=st.data())
    def fail_bundle(self, data):
        """The bundle raises (a step after EmbedTexts, say): the runner retries it in this process."""
        pipeline = data.draw(st.sampled_from(self._running()))
        with self._in(pipeline):
            pipeline.bundle.fail()
        pipeline.process.processor = None
        pipeline.retry, pipeline.bundle, pipeline.attempt = pipeline.attempt, None, []

    @rule(data=st.data(), after_paying=st.booleans())
    def process_dies(self, data, after_paying):
        """The worker process is killed (mid-bundle or idle; AFTER_PAYING: at the first request
        its bundle pays from now on, before its answer is kept). The runner retries its bundle
        in a new process."""
        pipeline = data.draw(st.sampled_from(self.pipelines))
        process = pipeline.process
        with self._in(pipeline):
            if after_paying and pipeline.bundle is not None:
                process.die_when_paid = True
                with contextlib.suppress(_Died):
                    self._push(pipeline, pipeline.attempt[pipeline.pushed:])
                    pipeline.bundle.finish()
            if process.processor is not None:   # what it had in flight ends (or not) with it
                process.processor.fns[-1]._pool.shutdown(wait=True)
        if pipeline.bundle is not None:
            pipeline.retry, pipeline.bundle, pipeline.attempt = pipeline.attempt, None, []
        pipeline.process = self._process()

    @rule()
    def compaction(self):
        compact(self.store)

    @precondition(lambda self: any(p.process.registry for p in self.pipelines))
    @rule(data=st.data())
    def refresh(self, data):
        pipeline = data.draw(st.sampled_from([p for p in self.pipelines if p.process.registry]))
        with self._in(pipeline) as process:
            process.store.refresh()
            process.listed = set(self.stored) | process.paid

    @invariant()
    def the_store_keeps_every_answer_kept(self):
        """Compactions included: a process that lists the store now finds every text kept."""
        fresh = PaidStore(StoreSpec(self.store), MODEL, DIMS)
        assert all(fresh.holds(sha) for sha in self.stored)

    def teardown(self):
        """Every row ends: the bundles left are run to their end."""
        try:
            for pipeline in self.pipelines:
                for _ in range(len(pipeline.rows) + 2):
                    if pipeline.bundle is None and not (pipeline.retry or pipeline.waiting()):
                        break
                    if pipeline.bundle is None:
                        pipeline.attempt, pipeline.retry, pipeline.pushed = pipeline.retry or pipeline.waiting(), [], 0
                        with self._in(pipeline):
                            pipeline.bundle = self._processor(pipeline).bundle()
                    self._finish(pipeline)
                assert pipeline.done.keys() == {r["id"] for r in pipeline.rows}
        finally:
            for pipeline in self.pipelines:
                if pipeline.process.processor is not None:
                    with self._in(pipeline):
                        pipeline.process.processor.teardown()


def _run(sandbox_factory, tmp_path, monkeypatch, examples: int, steps: int) -> None:
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--account-rps", "1000", "--account-burst", "1000"])
    Claims.sandbox, Claims.root = sb, tmp_path
    Claims.budget = resolve(MODEL, sb.base_url, KeySource()).budget(None)
    run_state_machine_as_test(Claims, settings=settings(
        max_examples=examples, stateful_step_count=steps, deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))


def test_claims_and_the_store_in_random_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=30, steps=25)


@pytest.mark.soak
def test_claims_and_the_store_in_many_more_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=400, steps=60)

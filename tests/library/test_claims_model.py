"""A model-based test of EmbedTexts's claims and its store of paid texts (hypothesis' stateful
testing), against a real sandbox over HTTP: its ledger is what was billed.

Two pipelines on one store, each in a worker process of its own that runs up to two bundles at
once, each on a thread of its own, as Beam's SDK harness drives them (tests/library/bundles.py).
The rules: bundles that start, read rows, finish, fail and are retried; requests held on the
wire across rules (billed, not answered yet), then answered, timed out, or failing after the
charge (their answer not kept); rows that wait for a text on the wire, for longer than any bound
the client's settings give a request; processes that die, their requests on the wire with them;
compactions, alone and in the middle of a listing; budget stops; the sandbox's 5xx and resets
after the charge; empty texts. Invariants:
- every input row ends in exactly one output of the bundles that succeeded: embedded (the
  sandbox's vector of its text), failed (an empty text) or pending (a reason of the table);
- a process sends a text only if it read a row of it while its listing of the store had none,
  and not while it keeps the text's answer or a request of it is on the wire, unless the
  bundle that sends it read the row before that request left (two bundles that claim one text
  at once each pay for it) or that request ended without keeping it;
- every answer kept is found by a process that lists the store after it was kept;
- a row waits for a text on the wire until its request ends, and no longer.
"""
from __future__ import annotations

import collections
import hashlib
import itertools
import threading
import time

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule, run_state_machine_as_test

from embedpipe._config import resolve
from service import errors
from service.client import MAX_TIMED_OUT
from service.credentials import KeySource
from service.sandbox.embedder import embed_text
from tests.conftest import SANDBOX_KEY
from tests.library.bundles import MODEL, Processor, library_fns, rows_of
from tests.library.model_parts import Held, Op, Pipeline, Process, Run, Sent, Died, ObservedClaims, ObservedCondition
from transforms.dedupe import store as stores
from transforms.dedupe.compaction import compact
from transforms.dedupe.store import SCOPE, PaidStore, StoreSpec
from transforms.pending import REASONS
from transforms.worker import runscoped
from transforms.worker.keyindex import key16


def _text(n: int) -> str:
    return f"text {n}: " + "words " * (3 + n % 5)


TEXTS = [_text(i) for i in range(10)] + [""]
DIMS = 1536
HELD_AT_ONCE = 2      # requests a process holds on the wire at once, well under its in-flight limit
SETTINGS = {"client": {"initial_backoff_s": 0.01, "max_backoff_s": 0.02, "max_total_s": 0.3,
                       "read_timeout_s": 0.5, "read_timeout_max_s": 0.5},
            "embed": {"initial_in_flight": 8, "max_refused_s": 0.1}, "budget": {"balance_poll_s": 3600.0}}
# longer than a request could take by its settings (retries, timed-out attempts, refusals): a
# request on the wire this long is what a row must wait for all the same
OUTLASTING_S = 0.3 + MAX_TIMED_OUT * 0.5 + 0.1 + 0.2
PICK = st.integers(0, 5)   # which of the candidates a rule takes (modulo their number)
WAIT_S = 20.0          # a thread that does not end within this is stuck (a failure, never a timing)
HELD_MAX_S = 6 * WAIT_S   # a request held longer outlived its example: it lets go, failing


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Claims(RuleBasedStateMachine):
    events: collections.Counter = collections.Counter()   # what the examples did, for the report
    sandbox = None   # set by the test
    root = None
    run_config = None
    _numbers = itertools.count()

    def __init__(self):
        super().__init__()
        self.events["examples"] += 1
        self.store = str(self.root / f"store-{next(self._numbers)}")
        self.lock = threading.RLock()
        self.clock = itertools.count()
        self.stored: set[str] = set()           # texts whose answers the store keeps
        self.violations: list[str] = []
        self.pipelines: list[Pipeline] = []
        self.processes = itertools.count()
        self.interrupt: int | None = None       # a compaction after this many listing steps
        self.sent_ids: set[str] = set()
        self.calls = itertools.count()
        self.seen = len(self.sandbox.ledger())

    @initialize(a=st.lists(st.sampled_from(TEXTS), min_size=2, max_size=16),
                b=st.lists(st.sampled_from(TEXTS), min_size=2, max_size=16), capped=st.booleans())
    def pipelines_on_one_store(self, a, b, capped):
        cfg = resolve(MODEL, self.sandbox.base_url, KeySource(), run_config=self.run_config)
        budget = cfg.budget(0.0002 if capped else None)   # a cap: a few requests, then pending rows
        for name, texts in (("a", a), ("b", b)):
            fns, _ = library_fns(self.sandbox.base_url, self.store, max_inputs=2, budget=budget,
                                 run_config=self.run_config, run_id=f"{self.store.rsplit('/', 1)[1]}-{name}")
            rows = [{"id": f"{name}{i}", "text": t} for i, t in enumerate(texts)]
            self.pipelines.append(Pipeline(name, fns, rows, self._process(fns)))

    def _process(self, fns) -> Process:
        claims = ObservedClaims()
        return Process(next(self.processes), claims, {fns[1]._scope: {"inflight": claims}})

    # -- a process's stage: set up as the harness does, its requests and answers observed ----------

    def _processor(self, pipeline: Pipeline) -> Processor:
        process = pipeline.process
        if process.idle:
            return process.idle.pop()
        with self.lock:   # what its first listing holds at least (an answer kept meanwhile may be missing)
            before = set(self.stored)
        saved, runscoped._by_run = runscoped._by_run, process.registry
        try:
            processor = Processor(pipeline.fns)
        finally:
            runscoped._by_run = saved
        embed = processor.fns[-1]
        embed._sender.client.embed = self._sending(embed._sender.client.embed, process)
        embed._sender.run = self._running(embed._sender.run, process)
        if process.budget is None:   # before any bundle of the process uses its guard
            process.budget = embed._sender.shared.guard._cond = ObservedCondition()
        if process.store is None:   # a process lists the store when it first uses it
            process.store = process.registry[SCOPE][next(iter(process.registry[SCOPE]))]
            process.listed = before
            put = process.store.put
            process.store.put = lambda row, shas, *a: self._put(process, put, row, shas, *a)
        return processor

    def _running(self, run, process: Process):
        """The sender's run of one packed request: what leaves in it is its bundle's (for
        _sending); it ends when run returns, right before Embed settles its claims."""
        def running(request):
            calls: list[int] = []
            self._local.bundle, self._local.calls = request[0].claim, calls
            try:
                return run(request)
            finally:
                with self.lock:
                    now = next(self.clock)
                    for call in calls:
                        process.sent[call].ended = now
        return running

    _local = threading.local()

    def _sending(self, embed, process: Process):
        def sending(model, texts, *args, request_id, **kwargs):
            if process.dead:
                raise Died()
            shas = [_sha(t) for t in texts]
            with self.lock:   # one call, one request leaving (two bundles may send one request id)
                self._local.call = call = next(self.calls)
                self._check_leaving(process, call, shas, self._local.bundle)
                self._local.calls.append(call)
                self.sent_ids.add(request_id)
            answer = embed(model, texts, *args, request_id=request_id, **kwargs)   # billed
            with self.lock:
                hold = Held(shas, self._local.bundle) if process.hold > 0 and len(process.held) < HELD_AT_ONCE else None
                if hold is not None:
                    process.hold -= 1
                    process.held[call] = hold
                    self.events["held"] += 1
            if hold is not None:
                if not hold.go.wait(HELD_MAX_S):
                    raise RuntimeError(f"held longer than {HELD_MAX_S} s: no rule or teardown let it go")
                if hold.outcome == "die" or process.dead:
                    raise Died()
                if hold.outcome == "time out":   # as the client says it: sent, maybe billed (it was)
                    exc = errors.APITimeoutError("no response within the read timeout")
                    exc.attempts = exc.uncertain_attempts = exc.timed_out_attempts = 1
                    raise exc
                if hold.outcome == "fail":
                    raise RuntimeError("the answer could not be kept (the journal's disk failed)")
            return answer
        return sending

    def _check_leaving(self, process: Process, call: int, shas: list[str], bundle: int) -> None:
        """The invariant on what a process sends, as each request leaves (under the lock)."""
        now = next(self.clock)
        run = next((r for p in self.pipelines for r in p.runs if r.number == bundle), None)
        for sha in shas:
            if sha not in process.unlisted:
                self.violations.append(f"process {process.number} sent a text its listing of the store had")
            for other in process.sent.values():
                if sha not in other.shas:
                    continue
                ended_unkept = other.ended is not None and not other.kept
                claimed_at_once = other.bundle != bundle and run is not None and run.reads.get(sha, now) < other.left
                if not (ended_unkept or claimed_at_once):
                    self.violations.append(
                        f"process {process.number} sent a text again while {'it kept its answer' if other.kept else 'a request of it was on the wire'}")
        process.sent[call] = Sent(shas, bundle, now)

    def _put(self, process: Process, put, row, shas, *args):
        if process.dead:
            raise Died()
        put(row, shas, *args)
        with self.lock:
            process.kept |= set(shas)
            process.listed |= set(shas)
            self.stored |= set(shas)
            process.sent[self._local.call].kept = True

    # -- waiting for what a rule started -----------------------------------------------------------

    def _release(self, process: Process, which=lambda held: True, outcome: str = "answer") -> None:
        """Let the held requests WHICH picks go with OUTCOME: on the wire no more from now."""
        with self.lock:
            for call, held in list(process.held.items()):
                if which(held):
                    del process.held[call]
                    held.outcome = outcome
                    held.go.set()

    def _blocked(self, pipeline: Pipeline, run: Run) -> bool:
        """Whether RUN's step waits for what only a rule can let go: a text held on the wire, or
        (finishing) its own requests, held or waiting for the budget guard while held requests
        keep their reservations (with _quiet: no other request runs)."""
        process = pipeline.process
        with self.lock:
            held_keys = {key16(s) for h in process.held.values() for s in h.shas}
            mine = any(h.bundle == run.number for h in process.held.values())
            parked = bool(process.held) and process.budget is not None and bool(process.budget.waiting)
        waits = process.claims.waiting.get(run.op.thread.ident)
        if waits is not None and waits in held_keys:
            self.events["a row waits on the wire"] += 1
        return (waits is not None and waits in held_keys) or (run.finishing and (mine or parked))

    def _wait(self, pipeline: Pipeline) -> None:
        """Until every step of PIPELINE's bundles is done or waits for a held request, and every
        request of its process not held has ended."""
        deadline, released = time.monotonic() + WAIT_S, False
        while True:
            steps = [r for r in pipeline.runs if r.op is not None and not r.op.done.is_set()]
            if all(self._blocked(pipeline, r) for r in steps) and self._quiet(pipeline.process, steps):
                ended = [r for r in pipeline.runs if r.op is not None and r.op.done.is_set()]
                if not ended:
                    return
                for run in ended:   # a failed bundle's requests are answered: what waited for them goes on
                    self._ended(pipeline, run)
                continue
            if time.monotonic() > deadline:
                # a real timeout dropped the in-flight limit to what the held requests hold: let them go
                assert pipeline.process.held and not released, "a row waits for a request that ended, or a step is stuck"
                self.events["held let go after WAIT_S"] += 1
                self._release(pipeline.process)
                deadline, released = time.monotonic() + WAIT_S, True
            time.sleep(0.002)

    def _quiet(self, process: Process, steps: list[Run]) -> bool:
        with self.lock:
            return all(s.ended is not None for call, s in process.sent.items() if call not in process.held) \
                and all(self._idle_pool(p) for p in self.pipelines if p.process is process)

    @staticmethod
    def _idle_pool(pipeline: Pipeline) -> bool:
        """No request of its bundles waits to leave or is running but those held, and those
        waiting for the budget guard while held ones keep their reservations."""
        process = pipeline.process
        held = len(process.held)
        parked = len(process.budget.waiting) if held and process.budget is not None else 0
        running = sum(1 for run in pipeline.runs for f in getattr(run.processor.fns[-1], "_futures", ())
                      if not f.done())
        return running <= held + parked

    def _ended(self, pipeline: Pipeline, run: Run) -> None:
        """RUN's step is over: a finished bundle's outputs checked and kept, a failed one retried."""
        op, run.op = run.op, None
        self.events["bundle failed" if op.error is not None else "finished" if run.finishing else "read"] += 1
        if op.error is not None:
            self._failed(pipeline, run)
        elif run.finishing:
            self._check_outputs(pipeline, run, op.result)
            pipeline.runs.remove(run)
            pipeline.process.idle.append(run.processor)

    def _failed(self, pipeline: Pipeline, run: Run) -> None:
        """The bundle raised: Beam tears its processor down (which waits for its requests on the
        wire: they are answered) and retries its rows."""
        self._release(pipeline.process, lambda held: held.bundle == run.number)
        pipeline.runs.remove(run)
        run.bundle.fail()
        pipeline.retry.append(run.rows)

    def _check_outputs(self, pipeline: Pipeline, run: Run, out: dict) -> None:
        rows = rows_of(out)
        ids = sorted(r["id"] for r in run.rows)
        ended = [d for d, _ in rows["embeddings"]] + [d for d, _, _ in rows["failed"]] + [d for d, _, _ in rows["pending"]]
        assert sorted(ended) == ids, rows
        text = {r["id"]: r["text"] for r in pipeline.rows}
        for doc_id, _, reason in rows["failed"]:
            assert reason == "empty_text" and text[doc_id] == "", rows
        for doc_id, _, reason in rows["pending"]:
            assert reason in REASONS and text[doc_id] != "", rows
            self.events[f"pending {reason}"] += 1
        assert all(text[d] != "" for d, _ in rows["embeddings"])
        for table in run.bundle.out["embeddings"]:
            for row in table.to_pylist():
                assert np.allclose(row["embedding"], embed_text(MODEL, text[row["doc_id"]], DIMS), atol=1e-6)
        for doc_id, reason in [(d, None) for d, _ in rows["embeddings"]] + [(d, r) for d, _, r in rows["failed"]
                                                                            + rows["pending"]]:
            assert doc_id not in pipeline.done
            pipeline.done[doc_id] = reason

    # -- the rules: each draws the same whatever the state (its threads make that vary), and does
    # nothing when it does not apply -------------------------------------------------------------

    def _pick(self, candidates: list, pick: int):
        self.events["steps"] += 1
        return candidates[pick % len(candidates)] if candidates else None

    def _run_for(self, pick: int, rows_left: bool = False) -> tuple[Pipeline, Run] | None:
        """A bundle free to take a step (with rows to read, if ROWS_LEFT); else a new one, its
        pipeline's input growing when every row was given to a bundle (a stream)."""
        free = [(p, r) for p in self.pipelines for r in p.runs if r.op is None and (r.pushed < len(r.rows)
                                                                                   or not rows_left)]
        if free:
            return free[pick % len(free)]
        pipeline = self._pick([p for p in self.pipelines if len(p.runs) < 2], pick)
        if pipeline is None:
            return None
        self._start(pipeline, 1 + pick % 4)
        return pipeline, pipeline.runs[-1]

    @rule(pick=PICK, size=st.integers(1, 4))
    def start_bundle(self, pick, size):
        pipeline = self._pick([p for p in self.pipelines if len(p.runs) < 2], pick)
        if pipeline is not None:
            self._start(pipeline, size)

    def _start(self, pipeline: Pipeline, size: int) -> None:
        if not (pipeline.retry or pipeline.waiting()):   # more input: a new text twice, and texts met before
            n = len(pipeline.rows)
            texts = [_text(n), _text(n), TEXTS[n % 10], TEXTS[(n + 3) % 10]]
            pipeline.rows += [{"id": f"{pipeline.name}{n + i}", "text": t} for i, t in enumerate(texts)]
        rows = pipeline.retry.pop(0) if pipeline.retry else pipeline.waiting()[:size]
        processor = self._processor(pipeline)
        bundle = processor.bundle()
        pipeline.runs.append(Run(rows, processor, bundle, processor.fns[1]._bundle))

    def _step(self, pipeline: Pipeline, run: Run, step, hold: bool) -> None:
        if hold:
            pipeline.process.hold = 1
        run.op = Op(step)
        self._wait(pipeline)
        pipeline.process.hold = 0

    @rule(pick=PICK, n=st.integers(1, 3), hold=st.booleans())
    def read_rows(self, pick, n, hold):
        """A bundle reads N rows (HOLD: a request they send stays on the wire)."""
        picked = self._run_for(pick, rows_left=True)
        if picked is None:
            return
        pipeline, run = picked
        rows = run.rows[run.pushed:run.pushed + n]
        run.pushed += len(rows)
        self._read(pipeline, run, rows)
        self._step(pipeline, run, lambda: run.bundle.push(rows), hold)

    def _read(self, pipeline: Pipeline, run: Run, rows: list[dict]) -> None:
        process = pipeline.process
        with self.lock:
            for r in rows:
                if r["text"]:
                    sha = _sha(r["text"])
                    run.reads.setdefault(sha, next(self.clock))
                    if sha not in process.listed:
                        process.unlisted.add(sha)

    @rule(pick=PICK, hold=st.booleans())
    def finish_bundle(self, pick, hold):
        picked = self._run_for(pick)
        if picked is not None:
            self._finish(*picked, hold)

    def _finish(self, pipeline: Pipeline, run: Run, hold: bool) -> None:
        rows = run.rows[run.pushed:]
        run.pushed, run.finishing = len(run.rows), True
        self._read(pipeline, run, rows)
        self._step(pipeline, run, lambda: (run.bundle.push(rows), run.bundle.finish())[1], hold)

    @rule(pick=PICK, n=st.integers(0, 2), retry_now=st.booleans())
    def fail_bundle(self, pick, n, retry_now):
        """A bundle reads N rows more, then raises (a step after EmbedTexts, say): the runner
        retries it in this process (RETRY_NOW: at once, to its end)."""
        picked = self._run_for(pick)
        if picked is None:
            return
        pipeline, run = picked
        if n and run.pushed < len(run.rows):
            rows = run.rows[run.pushed:run.pushed + n]
            run.pushed += len(rows)
            self._read(pipeline, run, rows)
            self._step(pipeline, run, lambda: run.bundle.push(rows), False)
        if run in pipeline.runs and run.op is None:
            self.events["bundle failed by rule"] += 1
            self._failed(pipeline, run)
            self._wait(pipeline)
            if retry_now and len(pipeline.runs) < 2 and pipeline.retry:
                self._start(pipeline, 0)
                self._finish(pipeline, pipeline.runs[-1], hold=False)

    @rule(pick=PICK, outcome=st.sampled_from(["answer", "answer", "time out", "fail"]))
    def the_wire_answers(self, pick, outcome):
        """A held request ends: answered, timed out (billed, no answer: pending), or failing once
        paid (the answer not kept: its bundle fails). When rows wait for its texts, only after
        longer than any bound the client's settings give a request: they wait on."""
        picked = self._pick([(p, call) for p in self.pipelines for call in sorted(p.process.held)], pick)
        if picked is None:
            return
        pipeline, call = picked
        target = pipeline.process.held[call]
        if self._rows_waiting_for(pipeline, target):
            self.events["slow answers"] += 1
            time.sleep(OUTLASTING_S)
            self._wait(pipeline)
        self._release(pipeline.process, lambda held: held is target, outcome)
        self._wait(pipeline)

    def _rows_waiting_for(self, pipeline: Pipeline, held: Held) -> bool:
        keys = {key16(s) for s in held.shas}
        return any(pipeline.process.claims.waiting.get(r.op.thread.ident) in keys
                   for r in pipeline.runs if r.op is not None)

    @rule(pick=PICK)
    def process_dies(self, pick):
        """A worker process is killed, with whatever it had on the wire: the runner retries its
        bundles in a new process."""
        pipeline = self._pick([p for p in self.pipelines if p.runs], pick)
        if pipeline is None:
            return
        process = pipeline.process
        process.dead = True
        self.events["died"] += 1
        self._release(process, outcome="die")
        for run in pipeline.runs:
            if run.op is not None:
                assert run.op.done.wait(WAIT_S), "a step of a dead process is stuck"
        for processor in [r.processor for r in pipeline.runs] + process.idle:
            processor.fns[-1]._pool.shutdown(wait=True)
        pipeline.retry += [run.rows for run in pipeline.runs]
        pipeline.runs = []
        pipeline.process = self._process(pipeline.fns)

    @rule()
    def compaction(self):
        compact(self.store)

    @rule(pick=PICK, after=st.sampled_from([0, 1, 1, 2]))
    def listing(self, pick, after):
        """A process lists the store again; a compaction runs AFTER that many of the listing's
        steps (0: none; 1, the likeliest: between the journal's listing and the files'). The
        listing holds every answer kept before it began."""
        pipeline = self._pick([p for p in self.pipelines if p.process.store is not None], pick)
        if pipeline is None:
            return
        process = pipeline.process
        with self.lock:
            before = set(self.stored)
        self.interrupt = after or None
        try:
            process.store.refresh()
        finally:
            self.interrupt = None
        missed = [sha for sha in before if not process.store.holds(sha)]
        assert not missed, f"a listing missed {len(missed)} answers kept before it began"
        with self.lock:
            process.listed = before | process.kept

    def _matching(self, patterns, real):
        """The store's listing steps: a compaction runs after the one `listing` asks for."""
        found = real(patterns)
        if self.interrupt is not None and threading.current_thread() is threading.main_thread():
            self.interrupt -= 1
            if self.interrupt == 0:
                self.interrupt = None
                if compact(self.store).entries:
                    self.events["a compaction within a listing"] += 1
        return found

    @invariant()
    def what_was_sent_was_the_processes_to_send(self):
        assert not self.violations, self.violations

    @invariant()
    def the_store_keeps_every_answer_kept(self):
        """Every answer kept before a listing begins is in it (a request the harness counts as
        idle may still settle meanwhile: an answer kept during the listing may be in it or not)."""
        with self.lock:
            before = set(self.stored)
        fresh = PaidStore(StoreSpec(self.store), MODEL, DIMS)
        missed = [sha for sha in before if not fresh.holds(sha)]
        assert not missed, f"a new listing missed {len(missed)} of the {len(before)} answers kept before it began"

    def teardown(self):
        """Every row ends: requests on the wire are answered and the bundles left run to their end."""
        try:
            for pipeline in self.pipelines:
                for _ in range(8 * len(pipeline.rows) + 8):
                    self._release(pipeline.process)
                    self._wait(pipeline)
                    run = next((r for r in pipeline.runs if r.op is None), None)
                    if run is not None:
                        self._finish(pipeline, run, hold=False)
                    elif len(pipeline.runs) < 2 and (pipeline.retry or pipeline.waiting()):
                        self._start(pipeline, len(pipeline.rows))
                    elif not pipeline.runs:
                        break
                assert pipeline.done.keys() == {r["id"] for r in pipeline.rows}, "rows that never ended"
            assert not self.violations, self.violations
            assert {c["request_id"] for c in self.sandbox.ledger()[self.seen:]} <= self.sent_ids
        finally:
            for pipeline in self.pipelines:
                pipeline.process.dead = True
                self._release(pipeline.process, outcome="die")
                for processor in [r.processor for r in pipeline.runs] + pipeline.process.idle:
                    processor.fns[-1]._pool.shutdown(wait=True)


def _run(sandbox_factory, tmp_path, monkeypatch, examples: int, steps: int) -> None:
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"seed": 11, "rate_500": 0.05, "rate_reset_after_charge": 0.05}))
    settings_file = tmp_path / "pipeline.yaml"
    settings_file.write_text(yaml.safe_dump(SETTINGS))
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0,
                         args=["--account-rps", "1000", "--account-burst", "1000", "--faults", str(faults)])
    Claims.sandbox, Claims.root, Claims.run_config = sb, tmp_path, str(settings_file)
    real = stores._matching
    monkeypatch.setattr(stores, "_matching", lambda patterns: _Tracked.current._matching(patterns, real))
    Claims.events.clear()
    try:
        run_state_machine_as_test(_Tracked, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
            phases=(Phase.generate,), report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        print("what the examples did:", dict(sorted(Claims.events.items())))


class _Tracked(Claims):
    """The machine of the example running now, for the store's listing steps."""
    current: Claims | None = None

    def __init__(self):
        super().__init__()
        _Tracked.current = self


def test_claims_and_the_store_in_random_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=30, steps=50)


@pytest.mark.soak
def test_claims_and_the_store_in_many_more_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=300, steps=80)

"""A model-based test of ServiceTextEmbeddings's batches in one worker process (embedpipe/paid.py
PaidTexts, embedpipe/mltransform.py), with hypothesis' stateful testing against a real sandbox
over HTTP: batches that run at once on threads of their own, as RunInference's do, sharing
texts; requests held on the wire across rules (billed, not answered yet), then answered or
failing (their batch fails, and the runner runs it again); timeouts, budget stops, the store and
other processes are tests/library/test_claims_model.py's. Invariants:
- a request leaves with a text only while this process neither has its vector nor has a request
  of it on the wire: each text is paid once unless its request ended without a vector;
- a batch that returns gives each text the sandbox's vector, or a pending reason of the table;
  one that waited for a text another batch was sending gets the vector or sends it itself;
- every batch ends once nothing is held on the wire (none waits for a text nobody sends).
"""
from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import threading
import time

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

import embedpipe
from embedpipe.mltransform import _Service
from service.sandbox.embedder import embed_text
from tests.conftest import SANDBOX_KEY
from tests.frames import current_frames
from tests.library.helpers import MODEL, models_config
from transforms.pending import REASONS

TEXTS = [f"batch text {i}: " + "words " * (2 + i) for i in range(4)]
DIMS = 1536
HELD_AT_ONCE = 2
SETTINGS = {"client": {"initial_backoff_s": 0.01, "max_backoff_s": 0.02},
            "embed": {"initial_in_flight": 8}, "budget": {"balance_poll_s": 3600.0}}
WAIT_S = 20.0          # a batch that neither ends nor waits within this is stuck (never a timing)
HELD_MAX_S = 6 * WAIT_S   # a request held longer outlived its example: it lets go, failing


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@dataclasses.dataclass
class Held:
    shas: list[str]
    go: threading.Event = dataclasses.field(default_factory=threading.Event)
    outcome: str = "answer"


@dataclasses.dataclass
class Batch:
    texts: list[str]
    thread: threading.Thread | None = None
    results: list | None = None
    error: BaseException | None = None
    tries: int = 1


class Batches(RuleBasedStateMachine):
    events: collections.Counter = collections.Counter()
    sandbox = None   # set by the test
    manager = None

    def __init__(self):
        super().__init__()
        self.service = _Service(self.manager.job())   # a worker process's, fresh
        self.lock = threading.RLock()
        self.calls = itertools.count()
        self.on_wire: dict[int, list[str]] = {}   # call -> its texts, while the request is out
        self.vectors: set[str] = set()            # texts this process got a vector for
        self.held: dict[int, Held] = {}
        self.hold = 0
        self.batches: list[Batch] = []
        self.violations: list[str] = []
        run, embed = self.service.sender.run, self.service.sender.client.embed
        self.service.sender.run = lambda request: self._running(run, request)
        self.service.sender.client.embed = lambda model, texts, *a, **k: self._sending(embed, model, texts, *a, **k)

    def _running(self, run, request):
        """The sender's run of one request: what it gets a vector for, this process has."""
        outcome = run(request)
        with self.lock:
            self.vectors |= {i.text_sha256 for d in outcome.deliveries for i in d.items}
        return outcome

    def _sending(self, embed, model, texts, *args, **kwargs):
        shas = [_sha(t) for t in texts]
        with self.lock:
            call = next(self.calls)
            for sha in shas:
                if sha in self.vectors or any(sha in out for out in self.on_wire.values()):
                    self.violations.append("a text left again while this process had its vector or it was on the wire")
            self.on_wire[call] = shas
        try:
            answer = embed(model, texts, *args, **kwargs)   # billed
            with self.lock:
                hold = Held(shas) if self.hold and len(self.held) < HELD_AT_ONCE else None
                if hold is not None:
                    self.hold -= 1
                    self.held[call] = hold
                    self.events["held"] += 1
            if hold is not None:
                if not hold.go.wait(HELD_MAX_S):
                    raise RuntimeError(f"held longer than {HELD_MAX_S} s: no rule or teardown let it go")
                if hold.outcome == "fail":
                    raise RuntimeError("the answer could not be kept")
            return answer
        finally:
            with self.lock:
                del self.on_wire[call]

    # -- waiting --------------------------------------------------------------------------------

    @staticmethod
    def _parked(thread: threading.Thread) -> bool:
        """Whether THREAD waits (for a text another batch sends, or for its own requests)."""
        frame = current_frames().get(thread.ident)
        return frame is not None and frame.f_code.co_filename.endswith("threading.py")

    def _wait(self) -> None:
        """Until every batch has ended or waits, and every request out is held."""
        deadline = time.monotonic() + WAIT_S
        while True:
            with self.lock:
                out = set(self.on_wire) - set(self.held)
            running = [b for b in self.batches if b.thread.is_alive()]
            if not out and all(self._parked(b.thread) for b in running):
                time.sleep(0.01)   # settled, not between two steps: the same again a moment later
                with self.lock:
                    out = set(self.on_wire) - set(self.held)
                if not out and all(self._parked(b.thread) for b in running):
                    break
            assert time.monotonic() < deadline, (
                f"within {WAIT_S} s, {len(out)} requests not held still out, or a batch neither ended "
                f"nor waits (for a text nobody sends?): {len(running)} running, {len(self.held)} held")
            time.sleep(0.002)
        while ended := [b for b in self.batches if not b.thread.is_alive()]:
            self._ended(ended[0])   # (a batch run again waits in its turn)

    def _ended(self, batch: Batch) -> None:
        self.batches.remove(batch)
        if batch.error is not None:   # RunInference's runner runs the batch again
            self.events["batch failed"] += 1
            assert batch.tries < 8, batch.error
            self._start(batch.texts, 0, batch.tries + 1)
            return
        self.events["batch done"] += 1
        for text, result in zip(batch.texts, batch.results, strict=True):
            if result.vector is None:
                assert result.error in REASONS, (result.error, result.detail)
                self.events[f"pending {result.error}"] += 1
            else:
                assert np.allclose(result.vector, embed_text(MODEL, text, DIMS), atol=1e-6)

    def _start(self, texts: list[str], hold: int, tries: int = 1) -> None:
        batch = Batch(texts, tries=tries)

        def run():
            try:
                batch.results = self.service.embed(texts)
            except BaseException as exc:
                batch.error = exc
        self.hold = hold
        batch.thread = threading.Thread(target=run, daemon=True)
        self.batches.append(batch)
        batch.thread.start()
        self._wait()
        self.hold = 0

    # -- the rules ------------------------------------------------------------------------------

    @rule(texts=st.lists(st.sampled_from(TEXTS), min_size=1, max_size=4), hold=st.sampled_from([2, 1, 0]))
    def a_batch(self, texts, hold):
        """RunInference gives the model a batch (its first HOLD requests stay on the wire)."""
        if len(self.batches) < 3:
            self._start(texts, hold)

    @rule(pick=st.integers(0, 3), outcome=st.sampled_from(["fail", "answer"]))
    def the_wire_answers(self, pick, outcome):
        with self.lock:
            calls = sorted(self.held)
            if not calls:
                return
            held = self.held.pop(calls[pick % len(calls)])
        self.events[f"the wire: {outcome}"] += 1
        held.outcome = outcome
        held.go.set()
        self._wait()

    @invariant()
    def each_text_left_while_it_was_this_process_to_send(self):
        assert not self.violations, self.violations

    def teardown(self):
        try:
            for _ in range(20):
                with self.lock:
                    for held in self.held.values():
                        held.go.set()
                    self.held.clear()
                self._wait()
                if not self.batches:
                    break
            assert not self.batches and not self.violations, self.violations
        finally:
            with self.lock:
                for held in self.held.values():
                    held.go.set()
            self.service.pool.shutdown(wait=False)


def _run(sandbox_factory, tmp_path, monkeypatch, examples: int, steps: int) -> None:
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    settings_file = tmp_path / "pipeline.yaml"
    settings_file.write_text(yaml.safe_dump(SETTINGS))
    Batches.sandbox = sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0,
                                           args=["--account-rps", "1000", "--account-burst", "1000"])
    Batches.manager = embedpipe.ServiceTextEmbeddings(
        ["text"], MODEL, sb.base_url, models_config=models_config(tmp_path, max_inputs_per_request=2),
        run_config=str(settings_file))
    Batches.events.clear()
    try:
        run_state_machine_as_test(Batches, settings=settings(
            max_examples=examples, stateful_step_count=steps, deadline=None, database=None,
            phases=(Phase.generate,), report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much]))
    finally:
        print("what the examples did:", dict(sorted(Batches.events.items())))


def test_batches_sharing_texts_in_random_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=100, steps=20)


@pytest.mark.soak
def test_batches_sharing_texts_in_many_more_interleavings(sandbox_factory, tmp_path, monkeypatch):
    _run(sandbox_factory, tmp_path, monkeypatch, examples=300, steps=40)

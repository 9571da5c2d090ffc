"""The parts of tests/library/test_claims_model.py's machine: a process's observed claims, its
requests from when they leave, the held ones, a bundle's attempt and its steps on a thread of
their own, a pipeline."""
from __future__ import annotations

import dataclasses
import threading

from tests.library.bundles import Bundle, Processor
from transforms.dedupe.inflight import InFlightClaims
from transforms.dedupe.store import PaidStore
from transforms.worker.keyindex import key16


class Died(BaseException):
    """The process is gone (SIGKILL): raised where it would have gone on."""


class ObservedClaims(InFlightClaims):
    """A process's claims, telling which threads wait for a text on the wire."""

    def __init__(self):
        super().__init__()
        self.waiting: dict[int, bytes] = {}   # thread -> the key it waits for

    def add(self, sha, ref, bundle, stored):
        with self._cond:
            if key16(sha) in self._sent:
                self.waiting[threading.get_ident()] = key16(sha)
        try:
            return super().add(sha, ref, bundle, stored)
        finally:
            with self._cond:
                self.waiting.pop(threading.get_ident(), None)


class ObservedCondition(threading.Condition):
    """A budget guard's condition, telling which threads wait on it for a request to settle: a
    thread counts from its wait until it is woken (the guard wakes all at once)."""

    def __init__(self):
        super().__init__()
        self.waiting: set[int] = set()

    def wait(self, timeout=None):
        self.waiting.add(threading.get_ident())
        try:
            return super().wait(timeout)
        finally:
            self.waiting.discard(threading.get_ident())

    def notify(self, n=1):
        self.waiting.clear()
        super().notify(n)


@dataclasses.dataclass
class Sent:
    """A request, from when it left."""
    shas: list[str]
    bundle: int
    left: int
    ended: int | None = None
    kept: bool = False


@dataclasses.dataclass
class Held:
    """A request on the wire, billed, until a rule lets it go with OUTCOME."""
    shas: list[str]
    bundle: int
    go: threading.Event = dataclasses.field(default_factory=threading.Event)
    outcome: str = "answer"    # answer | time out | fail | die


@dataclasses.dataclass
class Process:
    """One incarnation of a pipeline's worker process."""
    number: int
    claims: ObservedClaims
    registry: dict
    store: PaidStore | None = None
    budget: ObservedCondition | None = None                  # its budget guard's, from its first bundle
    idle: list[Processor] = dataclasses.field(default_factory=list)   # set up, their last bundle done
    listed: set = dataclasses.field(default_factory=set)     # texts stored at its last listing, or kept by it
    unlisted: set = dataclasses.field(default_factory=set)   # texts it read while its listing had none
    kept: set = dataclasses.field(default_factory=set)       # texts whose answers it put in the store
    sent: dict = dataclasses.field(default_factory=dict)     # call -> Sent (a request id may leave twice)
    held: dict = dataclasses.field(default_factory=dict)     # call -> Held
    hold: int = 0                                            # requests to hold as they leave
    dead: bool = False


class Op:
    """A bundle's step on a thread of its own (the harness's): it may wait for a text on the wire."""

    def __init__(self, step):
        self.error: BaseException | None = None
        self.result = None
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(step,), daemon=True)
        self.thread.start()

    def _run(self, step):
        try:
            self.result = step()
        except BaseException as exc:   # a failed bundle, or a process that died
            self.error = exc
        finally:
            self.done.set()


@dataclasses.dataclass
class Run:
    """One attempt of a bundle."""
    rows: list[dict]
    processor: Processor
    bundle: Bundle
    number: int                      # its claims' bundle number
    pushed: int = 0
    reads: dict = dataclasses.field(default_factory=dict)   # sha -> when it first read a row of it
    op: Op | None = None
    finishing: bool = False


@dataclasses.dataclass
class Pipeline:
    name: str
    fns: list
    rows: list[dict]
    process: Process
    done: dict = dataclasses.field(default_factory=dict)     # id -> (kind, reason), from bundles that succeeded
    runs: list[Run] = dataclasses.field(default_factory=list)
    retry: list[list[dict]] = dataclasses.field(default_factory=list)   # rows of bundles that failed

    def waiting(self) -> list[dict]:
        busy = {r["id"] for rows in [*(run.rows for run in self.runs), *self.retry] for r in rows}
        return [r for r in self.rows if r["id"] not in self.done and r["id"] not in busy]

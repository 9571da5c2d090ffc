"""Progress of the whole job, whatever the runner: every worker process adds its counts to one
`Progress` per run and writes them to DIR/_progress/<run_id>/<process>.json (temporary name,
then rename) as soon as they first change, then at most every interval; the driver sums those
files into one line.

Where requests are planned as documents are read (the local runner streams: a request leaves
once it is full, and reading waits for a place in flight), the share done is the documents
read times the requests answered of those planned for them: requests planned x documents /
documents read estimates the whole job's. Where texts are grouped first (other runners), every
document is read before the first request is packed and the total is not known until the last
one is: the line then counts, without a share or an ETA that would be a guess.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import uuid
from typing import ClassVar

from apache_beam.io.filesystems import FileSystems

from transforms.files import remove_empty_dirs

log = logging.getLogger("embedpipe.progress")

PROGRESS_DIR = "_progress"


@dataclasses.dataclass
class Counts:
    documents: int = 0      # read (and split) so far
    planned: int = 0        # requests packed for them, to be sent
    answered: int = 0       # of those, the ones sent and settled (answered, or refused for good)
    chunks: int = 0         # embedded (rows written)
    tokens: int = 0
    requests: int = 0       # rows of requests (a re-split request has several)
    cost_micro: int = 0

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))


def progress_dir(output_dir: str, run_id: str) -> str:
    return FileSystems.join(FileSystems.join(output_dir, PROGRESS_DIR), run_id)


class Progress:
    """One worker process's counts for a run, flushed at most every `interval_s`."""

    _lock: ClassVar[threading.Lock] = threading.Lock()
    _by_run: ClassVar[dict] = {}

    def __init__(self, output_dir: str, run_id: str, interval_s: float, clock=time.monotonic):
        self._mutex = threading.Lock()
        self._path = FileSystems.join(progress_dir(output_dir, run_id), f"{uuid.uuid4().hex}.json")
        self._interval, self._clock = interval_s, clock
        self._last = clock() - interval_s   # the first change is written at once
        self.counts = Counts()

    @classmethod
    def for_run(cls, output_dir: str, run_id: str, interval_s: float) -> Progress:
        with cls._lock:
            if run_id not in cls._by_run:
                cls._by_run[run_id] = cls(output_dir, run_id, interval_s)
            return cls._by_run[run_id]

    def add(self, **counts: int) -> None:
        with self._mutex:
            self.counts = self.counts + Counts(**counts)
            now = self._clock()
            if now - self._last < self._interval:
                return
            self._last = now
            snapshot = dataclasses.asdict(self.counts)
        self._write(snapshot)

    def flush(self) -> None:
        with self._mutex:
            snapshot = dataclasses.asdict(self.counts)
        self._write(snapshot)

    def _write(self, snapshot: dict) -> None:
        temp = f"{self._path}.tmp-{uuid.uuid4().hex}"
        try:
            with FileSystems.create(temp) as fh:
                fh.write(json.dumps(snapshot).encode())
            FileSystems.rename([temp], [self._path])
        except Exception as exc:  # progress is a courtesy: never fail a bundle for it
            log.debug("could not write progress: %s", exc)


def discard(output_dir: str, run_id: str) -> None:
    """The run is over: its reports go (the summary has the figures)."""
    with Progress._lock:
        Progress._by_run.pop(run_id, None)
    directory, base = progress_dir(output_dir, run_id), FileSystems.join(output_dir, PROGRESS_DIR)
    try:
        reports = [m.path for m in FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list]
        if reports:  # object stores have no directories: delete the objects themselves
            FileSystems.delete(reports)
    except Exception as exc:
        log.debug("could not remove progress reports: %s", exc)
    remove_empty_dirs((directory, base))


def read_counts(output_dir: str, run_id: str) -> Counts:
    """The whole job's counts so far: the sum of every worker process's last flush."""
    total = Counts()
    try:
        pattern = FileSystems.join(progress_dir(output_dir, run_id), "*.json")
        paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    except Exception:
        return total
    for path in paths:
        try:
            with FileSystems.open(path) as fh:
                total = total + Counts(**json.loads(fh.read()))
        except Exception:  # renamed away or half-listed: the next look has it
            continue
    return total


def done(counts: Counts, total_documents: int) -> float:
    """The share of the job done, 0 to 1: the documents read (all, when their number is not
    known), times the requests answered of those planned."""
    read = min(counts.documents / total_documents, 1.0) if total_documents else 1.0
    return read * (min(counts.answered / counts.planned, 1.0) if counts.planned else 1.0)


def eta_s(share: float, elapsed_s: float) -> float | None:
    """Seconds left at the pace so far; None before anything is done."""
    return elapsed_s * (1 - share) / share if share > 0 else None


def line(counts: Counts, total_documents: int, elapsed_s: float, paced: bool = True) -> str:
    """The log line; PACED: requests are planned as documents are read (the share and ETA hold)."""
    if paced:
        share = done(counts, total_documents)
        eta = eta_s(share, elapsed_s)
        answered = f"answered {counts.answered}/{counts.planned} requests ({100 * share:.0f}%)"
        left = f"; ETA {'?' if eta is None else f'{eta:.0f}s'}"
    else:
        answered, left = f"answered {counts.answered} requests", ""
    return (f"read {counts.documents}/{total_documents or '?'} documents, {answered}, embedded {counts.chunks} "
            f"chunks, {counts.tokens} tokens, {counts.requests} requests, {counts.cost_micro / 1e6:.6f} RUB{left}")

"""Distinct texts: each distinct chunk text of the run is sent once, for every row that uses it.

Two ways (transforms/dedupe/transform.py chooses):
- GroupDistinctTexts (a GroupByKey on text_sha256): exact on any number of workers, and the
  shuffle spreads the Embed step over workers by text hash. On Dataflow and Flink the shuffle
  goes to disk; on the local FnApiRunner it is held in memory whole, texts included.
- StreamDistinctTexts (the local runner): a text's first row claims it; rows that come while
  the claim is open (not yet sent) join it and share its cost; rows that come after it was
  sent are `late` and get a copy of the first row's outcome after the job (LateRefs, cost 0,
  like a vector reused from an earlier run). Nothing crosses a stage boundary, so texts stream
  from Read to Write and memory stays flat; the claims keep ~55 bytes per distinct text. With
  several worker processes the claims go through a file they share (claimfile.py), and a
  text's rows in a process other than the claiming one are late.
"""
from __future__ import annotations

import struct
import threading
from typing import NamedTuple

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.dedupe.claimfile import ClaimFile
from transforms.records import ChunkRef, Request, TextItem
from transforms.worker import (
    coders,  # noqa: F401  (registers the coder of Request)
    runscoped,
)
from transforms.worker.keyindex import KeyIndex, key16


class _ToTextItem(beam.DoFn):
    def __init__(self):
        self._distinct = Metrics.counter("embedpipe", "distinct_chunks")
        self._shared = Metrics.counter("embedpipe", "chunks_deduplicated")

    def process(self, grouped):
        sha, entries = grouped
        entries = list(entries)
        text, n_tokens, _ = entries[0]
        self._distinct.inc()
        self._shared.inc(len(entries) - 1)
        yield TextItem(sha, text, n_tokens, tuple(sorted(ref for _, _, ref in entries)))


class GroupDistinctTexts(beam.PTransform):
    """(text_sha256, (text, n_tokens, ChunkRef)) -> TextItem per distinct text_sha256."""

    def expand(self, entries):
        return (entries
                | "GroupByText" >> beam.GroupByKey()
                | "ToTextItem" >> beam.ParDo(_ToTextItem()))


class LateRef(NamedTuple):
    """A row whose text was already sent when it arrived, or claimed by another process: it
    takes a copy of what became of a row of that claim, FIRST (doc_id, chunk_index,
    token_start, token_end): the smallest one once sent here, the claiming one elsewhere."""
    ref: ChunkRef
    text_sha256: str
    first: tuple


_FIRST = struct.Struct("<qqq")


def _pack_first(ref: ChunkRef) -> bytes:
    """One bytes object instead of a tuple, a str and an int: every distinct text of a run
    keeps one until the end."""
    return _FIRST.pack(ref.chunk_index, ref.token_start, ref.token_end) + ref.doc_id.encode("utf-8", "surrogatepass")


def _unpack_first(packed: bytes) -> tuple:
    chunk_index, token_start, token_end = _FIRST.unpack_from(packed)
    return packed[_FIRST.size:].decode("utf-8", "surrogatepass"), chunk_index, token_start, token_end


class Claims:
    """The distinct texts one process has seen in a run (pure logic, thread-safe); with SHARED,
    those of every process sharing that file."""

    def __init__(self, shared: ClaimFile | None = None):
        self._mutex = threading.Lock()
        self._open: dict[bytes, list[ChunkRef]] = {}   # claimed, not yet sent: rows sharing it
        self._sent = KeyIndex()                        # sent, or another process's: a first row, _pack_first()
        self._shared = shared
        self.late: list[LateRef] = []                  # in SHARED instead, when there is one

    @classmethod
    def for_run(cls, run_id: str, shared: ClaimFile | None = None) -> Claims:
        return runscoped.shared(run_id, "claims", lambda: cls(shared))

    def add(self, sha: str, ref: ChunkRef) -> bool:
        """True when REF is the text's first row (the caller sends the text)."""
        key = key16(sha)
        with self._mutex:
            if (rows := self._open.get(key)) is not None:
                rows.append(ref)
                return False
            first = self._sent.get(key)
            if first is None and self._shared is not None:
                first = self._claimed_elsewhere(self._shared, key, ref)
            if first is None:
                self._open[key] = [ref]
                return True
            self._keep_late(LateRef(ref, sha, _unpack_first(first)))
            return False

    def _claimed_elsewhere(self, shared: ClaimFile, key: bytes, ref: ChunkRef) -> bytes | None:
        """Claims KEY in the SHARED file for REF; if another process had, its first row (kept:
        its other rows here need not ask the file again)."""
        if (first := shared.claim(key, _pack_first(ref))) is not None:
            self._sent.put(key, first)
        return first

    def _keep_late(self, late: LateRef) -> None:
        if self._shared is None:
            self.late.append(late)
        else:   # the driver reads the file: it cannot read a worker process's memory
            self._shared.add_late(late)

    def seal(self, item: TextItem) -> TextItem:
        """The text is being sent: every row that claimed it so far shares it; later ones are late."""
        key = key16(item.text_sha256)
        with self._mutex:
            rows = self._open.pop(key, None)
            if rows is None:  # not claimed here (a re-sent or foreign item): leave it as it is
                return item
            refs = tuple(sorted(rows))
            self._sent.put(key, _pack_first(refs[0]))
        return item._replace(refs=refs)


class _ClaimTexts(beam.DoFn):
    def __init__(self, run_id: str, shared: ClaimFile | None):
        self._run_id, self._claim_file = run_id, shared
        self._distinct = Metrics.counter("embedpipe", "distinct_chunks")
        self._deduplicated = Metrics.counter("embedpipe", "chunks_deduplicated")

    def setup(self):
        self._claims = Claims.for_run(self._run_id, self._claim_file)

    def process(self, entry):
        sha, (text, n_tokens, ref) = entry
        if self._claims.add(sha, ref):
            self._distinct.inc()
            yield TextItem(sha, text, n_tokens, (ref,))
        else:
            self._deduplicated.inc()


class StreamDistinctTexts(beam.PTransform):
    """(text_sha256, (text, n_tokens, ChunkRef)) -> TextItem per text first seen in this
    process (with SHARED, in any process); its refs are completed by SealClaims when it is sent."""

    def __init__(self, run_id: str, shared: ClaimFile | None = None):
        super().__init__()
        self._run_id, self._shared = run_id, shared

    def expand(self, entries):
        return entries | "ClaimTexts" >> beam.ParDo(_ClaimTexts(self._run_id, self._shared))


class SealClaims(beam.PTransform):
    """Packed requests -> the same requests, each text carrying every row that claimed it in
    RUN_ID's claims; RUN_ID None: no claims (grouped texts), the requests as they are."""

    def __init__(self, run_id: str | None, shared: ClaimFile | None = None):
        super().__init__()
        self._run_id, self._shared = run_id, shared

    def expand(self, requests):
        run_id, shared = self._run_id, self._shared
        if run_id is None:
            return requests
        def seal(request: Request) -> Request:
            claims = Claims.for_run(run_id, shared)
            return Request(claims.seal(item) for item in request)

        return requests | "Seal" >> beam.Map(seal).with_output_types(Request)


class SealReused(beam.PTransform):
    """(TextItem, where its vector is) taken from an earlier run -> the same, the text carrying
    every row that claimed it so far; rows that come later are late, as for a sent text."""

    def __init__(self, run_id: str, shared: ClaimFile | None = None):
        super().__init__()
        self._run_id, self._shared = run_id, shared

    def expand(self, reused):
        run_id, shared = self._run_id, self._shared

        def seal(pair):
            item, where = pair
            return Claims.for_run(run_id, shared).seal(item), where

        return reused | "Seal" >> beam.Map(seal)


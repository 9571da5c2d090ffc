"""Read for the library: a PCollection of dicts (not Parquet) -> the entries and rejections
ReadDocuments gives, by the same splitter (transforms/read/split.py) and chunk entries. A
repeated id: its first row in the worker process is read, later ones are `duplicate_id`
(the CLI's scan rejects every row of such an id, which needs every id before the first
request; a stream cannot wait for that).

A bundle's ids are the process's once the bundle is known to have succeeded: Beam reuses a
DoFn instance only after its bundle succeeded, and tears down the instances of one that failed
before the runner retries it. So the ids a bundle read are forgotten when its instance is torn
down before starting another bundle, and its retry reads them again. A runner that lets an idle
step's instances go tears them down too: the ids of their last bundles are forgotten then,
which lets a later row of such an id through (rows of one id in two processes are both read
anyway); the other choice would lose a retried bundle's rows."""
from __future__ import annotations

import threading

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.windowed_value import WindowedValue

from service.tokenizer import get_encoding
from transforms.read.rows import check_row
from transforms.read.split import SplitConfig, Splitter
from transforms.read.transform import ENTRIES, REJECTED, chunk_entries
from transforms.records import Rejected
from transforms.worker import runscoped
from transforms.worker.keyindex import KeyIndex, key16


class _Ids:
    """The ids one process has read in a pipeline (thread-safe): ~32 bytes an id."""

    def __init__(self):
        self._lock, self._seen = threading.Lock(), KeyIndex()

    def first(self, doc_id: str) -> bytes | None:
        """The id's key if no row read before had DOC_ID, else None."""
        key = key16(doc_id)
        with self._lock:
            if key in self._seen:
                return None
            self._seen.put(key)
            return key

    def forget(self, keys: bytes) -> None:
        """KEYS (16 bytes each, back to back): the ids of a bundle that failed."""
        with self._lock:
            self._seen.discard(keys[i:i + 16] for i in range(0, len(keys), 16))


_GLOBAL = GlobalWindow()
_END = _GLOBAL.max_timestamp()


class _ReadRows(beam.DoFn):
    """Dicts -> entries and rejections: each row checked, the valid ones split BATCH_SIZE at a
    time (the splitter's batched encode) in one step, a batch held across the bundle (the
    global window's, as PackRequests' requests are)."""

    def __init__(self, id_field: str, text_field: str, split: SplitConfig, scope: str, batch_size: int):
        self._fields, self._split, self._scope, self._batch_size = (id_field, text_field), split, scope, batch_size
        self._rows = Metrics.counter("embedpipe", "documents")
        self._chunks = Metrics.counter("embedpipe", "chunks")

    def setup(self):
        self._ids = runscoped.shared(self._scope, "ids", _Ids)
        self._splitter = Splitter(get_encoding(), self._split)
        self._read = bytearray()

    def start_bundle(self):
        self._read = bytearray()   # Beam reuses an instance only after its bundle succeeded: its ids stay
        self._batch: list[tuple[str, str]] = []

    def process(self, element):
        self._rows.inc()
        checked = check_row(element, *self._fields)
        doc_id = checked.doc_id if isinstance(checked, Rejected) else checked[0]
        key = None if doc_id is None else self._ids.first(doc_id)
        if doc_id is not None and key is None:   # whatever its text: the id's first row is its own
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(
                doc_id, None, "duplicate_id", "an earlier row of the input has this id: that row is the id's"))
            return
        if key is not None:
            self._read += key
        if isinstance(checked, Rejected):
            yield beam.pvalue.TaggedOutput(REJECTED, checked)
        else:
            self._batch.append(checked)
            if len(self._batch) >= self._batch_size:
                batch, self._batch = self._batch, []
                yield from self._entries(batch)

    def finish_bundle(self):
        batch, self._batch = self._batch, []
        for entry in self._entries(batch):
            yield WindowedValue(entry, _END, (_GLOBAL,))

    def teardown(self):
        """Before another bundle: this one failed (or the step went idle); its retry reads its ids again."""
        if getattr(self, "_read", None):
            self._ids.forget(bytes(self._read))
            self._read = bytearray()

    def _entries(self, batch):
        for (doc_id, _), chunks in zip(batch, self._splitter.split_many(batch), strict=True):
            self._chunks.inc(len(chunks))
            yield from chunk_entries(doc_id, chunks)


class ReadRows(beam.PTransform):
    """A PCollection of dicts (the library's input) -> ReadDocuments' `entries` and `rejected`.
    An id's first row in the process (SCOPE: the pipeline's in-process state) is the one read."""

    def __init__(self, id_field: str, text_field: str, split: SplitConfig, scope: str, batch_size: int = 256):
        super().__init__()
        self._args = (id_field, text_field, split, scope, batch_size)

    def expand(self, rows):
        read = rows | "CheckAndSplit" >> beam.ParDo(_ReadRows(*self._args)).with_outputs(REJECTED, main=ENTRIES)
        return {ENTRIES: read[ENTRIES], REJECTED: read[REJECTED]}

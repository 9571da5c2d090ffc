"""Read for the library: a PCollection of dicts (not Parquet) -> the entries and rejections
ReadDocuments gives, by the same splitter (transforms/read/split.py) and chunk entries. A
repeated id: its first row in the worker process is read, later ones are `duplicate_id`
(the CLI's scan rejects every row of such an id, which needs every id before the first
request; a stream cannot wait for that)."""
from __future__ import annotations

import threading

import apache_beam as beam
from apache_beam.metrics import Metrics

from service.tokenizer import get_encoding
from transforms.read.rows import check_row
from transforms.read.split import SplitConfig, Splitter
from transforms.read.transform import ENTRIES, REJECTED, chunk_entries
from transforms.records import Rejected
from transforms.worker import runscoped
from transforms.worker.keyindex import KeyIndex, key16


class _Ids:
    """The ids one process has seen in a pipeline (thread-safe): ~32 bytes an id."""

    def __init__(self):
        self._lock, self._seen = threading.Lock(), KeyIndex()

    def first(self, doc_id: str) -> bool:
        key = key16(doc_id)
        with self._lock:
            if key in self._seen:
                return False
            self._seen.put(key)
            return True


class _CheckRows(beam.DoFn):
    def __init__(self, id_field: str, text_field: str, scope: str):
        self._fields, self._scope = (id_field, text_field), scope
        self._rows = Metrics.counter("embedpipe", "documents")

    def setup(self):
        self._ids = runscoped.shared(self._scope, "ids", _Ids)

    def process(self, element):
        self._rows.inc()
        checked = check_row(element, *self._fields)
        doc_id = checked.doc_id if isinstance(checked, Rejected) else checked[0]
        if doc_id is not None and not self._ids.first(doc_id):   # whatever its text: the id's first row is its own
            yield beam.pvalue.TaggedOutput(REJECTED, Rejected(
                doc_id, None, "duplicate_id", "an earlier row of the input has this id: that row is the id's"))
        elif isinstance(checked, Rejected):
            yield beam.pvalue.TaggedOutput(REJECTED, checked)
        else:
            yield checked


class _SplitRows(beam.DoFn):
    """A batch of (doc_id, text) -> entries, as _SplitTable's."""

    def __init__(self, split: SplitConfig):
        self._split = split
        self._chunks = Metrics.counter("embedpipe", "chunks")

    def setup(self):
        self._splitter = Splitter(get_encoding(), self._split)

    def process(self, batch):
        for (doc_id, _), chunks in zip(batch, self._splitter.split_many(batch)):
            self._chunks.inc(len(chunks))
            yield from chunk_entries(doc_id, chunks)


class ReadRows(beam.PTransform):
    """A PCollection of dicts (the library's input) -> ReadDocuments' `entries` and `rejected`.
    An id's first row in the process (SCOPE: the pipeline's in-process state) is the one read."""

    def __init__(self, id_field: str, text_field: str, split: SplitConfig, scope: str, batch_size: int = 256):
        super().__init__()
        self._fields, self._split, self._scope, self._batch_size = (id_field, text_field), split, scope, batch_size

    def expand(self, rows):
        checked = rows | "CheckRows" >> beam.ParDo(_CheckRows(*self._fields, self._scope)).with_outputs(
            REJECTED, main="valid")
        entries = (checked.valid
                   | "Batch" >> beam.BatchElements(min_batch_size=self._batch_size, max_batch_size=self._batch_size)
                   | "Split" >> beam.ParDo(_SplitRows(self._split)))
        return {ENTRIES: entries, REJECTED: checked[REJECTED]}

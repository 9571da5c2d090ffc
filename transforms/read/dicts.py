"""Read for the library: a PCollection of dicts (not Parquet) -> the entries and rejections
ReadDocuments gives, by the same splitter (transforms/read/split.py) and chunk entries; and the
duplicate-id rule of the CLI's scan, applied after Dedupe's grouping (DropRepeatedIds)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from service.tokenizer import get_encoding
from transforms.read.rows import check_row
from transforms.read.split import SplitConfig, Splitter
from transforms.read.transform import ENTRIES, REJECTED, chunk_entries
from transforms.records import Rejected, TextItem

IDS = "ids"


class _CheckRows(beam.DoFn):
    def __init__(self, id_field: str, text_field: str):
        self._fields = (id_field, text_field)
        self._rows = Metrics.counter("embedpipe", "documents")

    def process(self, element):
        self._rows.inc()
        checked = check_row(element, *self._fields)
        doc_id = checked.doc_id if isinstance(checked, Rejected) else checked[0]
        if doc_id is not None:   # any row with an id counts: a repeated id is ambiguous whatever its text
            yield beam.pvalue.TaggedOutput(IDS, doc_id)
        yield beam.pvalue.TaggedOutput(REJECTED, checked) if isinstance(checked, Rejected) else checked


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
    """A PCollection of dicts (the library's input) -> ReadDocuments' `entries` and `rejected`,
    and IDS: the id of each row that has one (what DropRepeatedIds counts)."""

    def __init__(self, id_field: str, text_field: str, split: SplitConfig, batch_size: int = 256):
        super().__init__()
        self._fields, self._split, self._batch_size = (id_field, text_field), split, batch_size

    def expand(self, rows):
        checked = rows | "CheckRows" >> beam.ParDo(_CheckRows(*self._fields)).with_outputs(REJECTED, IDS, main="valid")
        entries = (checked.valid
                   | "Batch" >> beam.BatchElements(min_batch_size=self._batch_size, max_batch_size=self._batch_size)
                   | "Split" >> beam.ParDo(_SplitRows(self._split)))
        return {ENTRIES: entries, REJECTED: checked[REJECTED], IDS: checked[IDS]}


class _DropRepeated(beam.DoFn):
    def process(self, item: TextItem, repeated):
        refs = tuple(r for r in item.refs if r.doc_id not in repeated)
        for r in item.refs:
            if r.doc_id in repeated and r.chunk_index == 0:   # one per row: each row has one first chunk
                yield beam.pvalue.TaggedOutput(REJECTED, Rejected(
                    r.doc_id, None, "duplicate_id", f"id occurs {repeated[r.doc_id]} times in the input"))
        if refs:
            yield item._replace(refs=refs)


class DropRepeatedIds(beam.PTransform):
    """Distinct texts (TextItems, all their rows: grouped) -> the same without the rows of an id
    that occurs more than once in IDS, each such row rejected once, as the CLI's scan does; a
    text no other row uses is not sent. Only ids are counted: the texts wait at the grouping
    that precedes this step anyway."""

    def __init__(self, ids):
        super().__init__()
        self._ids = ids

    def expand(self, items):
        repeated = (self._ids
                    | "CountIds" >> beam.combiners.Count.PerElement()
                    | "Repeated" >> beam.Filter(lambda kv: kv[1] > 1))
        return items | "DropRepeated" >> beam.ParDo(_DropRepeated(), beam.pvalue.AsDict(repeated)).with_outputs(
            REJECTED, main="items")

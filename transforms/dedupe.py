"""Dedupe: one element per distinct chunk text of the run, carrying every row that uses it.

The GroupByKey also gives the redistribution a Reshuffle would: the Embed step's work is
spread over workers by text hash, not by input file.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from transforms.records import ChunkRef, TextItem


def _chunk_entries(keyed_doc):
    doc_id, (chunks, kept) = keyed_doc
    for c in chunks:
        ref = ChunkRef(doc_id, c.chunk_index, c.chunk_count, c.token_start, c.token_end, c.n_tokens, kept)
        yield c.text_sha256, (c.text, c.n_tokens, ref)


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


class ChunkEntries(beam.PTransform):
    """(doc_id, (chunks, kept)) -> (text_sha256, (text, n_tokens, ChunkRef)) per chunk."""

    def expand(self, docs):
        return docs | "ChunkEntries" >> beam.FlatMap(_chunk_entries)


class GroupDistinctTexts(beam.PTransform):
    """(text_sha256, (text, n_tokens, ChunkRef)) -> TextItem per distinct text_sha256."""

    def expand(self, entries):
        return (entries
                | "GroupByText" >> beam.GroupByKey()
                | "ToTextItem" >> beam.ParDo(_ToTextItem()))

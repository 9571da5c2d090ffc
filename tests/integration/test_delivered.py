"""Skipping what DIR delivered, both ways (transforms/delivered.py), on real Parquet files in real
Beam pipelines: the streaming way (an index in the process) gives what the grouping way
(CoGroupByKey by doc id) gives, pieces of partly delivered chunks and their failures included."""
from __future__ import annotations

import datetime as dt
import hashlib

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from transforms import runscoped, schemas
from transforms.dedupe import ChunkEntries
from transforms.delivered import CARRIED, PIECES, SkipDelivered, SkipDeliveredStream
from transforms.lineage import embeddings_table, pending_table
from transforms.records import ChunkRef, Rejected, TextItem
from transforms.splitting import Chunk

KEPT = [pa.field("lang", pa.string())]
META = schemas.metadata("m", 4, "last-run")


def chunk(doc: str, index: int, count: int, text: str, start: int = 0, n: int = 5) -> Chunk:
    return Chunk(doc, index, count, start, start + n, n, text, hashlib.sha256(text.encode()).hexdigest())


def ref(c: Chunk, lang: str) -> ChunkRef:
    return ChunkRef(c.doc_id, c.chunk_index, c.chunk_count, c.token_start, c.token_end, c.n_tokens, (lang,))


def item(c: Chunk, lang: str) -> TextItem:
    return TextItem(c.text_sha256, c.text, c.n_tokens, (ref(c, lang),))


def write_dir(tmp_path):
    """DIR after a run that delivered a's chunk 0 whole and one piece of b's chunk 1 (the other
    piece pending, a third failed), and left c pending."""
    a0, b1_first = chunk("a", 0, 1, "alpha"), chunk("b", 1, 2, "beta one", 0, 3)
    b1_second, b1_third = chunk("b", 1, 2, "beta two", 3, 2), chunk("b", 1, 2, "beta three", 5, 1)
    c0 = chunk("c", 0, 1, "gamma")
    out = tmp_path / "out"
    out.mkdir()
    delivered = [item(a0, "en"), item(b1_first, "de")]
    pq.write_table(embeddings_table(delivered, np.zeros((2, 4), np.float32), ["r1", "r1"], [3, 4],
                                    schemas.embeddings(4, KEPT, META), "m", "last-run", KEPT,
                                    dt.datetime.now(dt.timezone.utc)), out / "embeddings-last-run-00000-of-00001.parquet")
    pending = pending_table([(item(b1_second, "de"), "budget_exhausted"), (item(c0, "fr"), "budget_exhausted")],
                            schemas.pending(KEPT, META), "m", "last-run", KEPT)
    pq.write_table(pending, out / "pending-last-run-00000-of-00001.parquet")
    failed = pa.Table.from_pylist([
        {"doc_id": "b", "chunk_index": 1, "reason": "too_long", "detail": "piece", "run_id": "last-run"},
        {"doc_id": "c", "chunk_index": 0, "reason": "bad_request", "detail": "whole", "run_id": "last-run"},
        {"doc_id": "d", "chunk_index": None, "reason": "empty_text", "detail": "doc", "run_id": "last-run"}],
        schema=schemas.FAILED)
    pq.write_table(failed, out / "failed-last-run-00000-of-00001.parquet")
    docs = [("a", ((a0,), ("en",))), ("b", ((chunk("b", 0, 2, "beta zero"), chunk("b", 1, 2, "beta whole", 0, 6)), ("de",))),
            ("c", ((c0,), ("fr",)))]
    return out, docs, b1_second


def check_way(transform, docs, expected_entries, expected_carried):
    """Run TRANSFORM on DOCS: the entries of the documents left and of the pieces, and the
    carried rejections, must be the expected ones."""
    with beam.Pipeline(runner=FnApiRunner()) as p:
        skipped = p | beam.Create(docs) | transform
        entries = skipped["docs"] | ChunkEntries()
        if PIECES in skipped._tags:  # the grouping way gives the pieces apart
            entries = (entries, skipped[PIECES]) | beam.Flatten()
        assert_that(entries, equal_to(expected_entries), label="Entries")
        assert_that(skipped[CARRIED], equal_to(expected_carried), label="Carried")


def test_both_ways_skip_the_same_rows_and_complete_the_same_chunks(tmp_path):
    out, docs, b1_second = write_dir(tmp_path)
    args = (str(out / "embeddings-*.parquet"), [str(out / "pending-last-run-00000-of-00001.parquet")],
            [str(out / "failed-last-run-00000-of-00001.parquet")], ["lang"])
    b = dict(docs)["b"][0]
    c0 = dict(docs)["c"][0][0]
    # a's only chunk and b's chunk 1 were delivered; b's chunk 0 and c are left; b's chunk 1
    # is completed from its pending piece, and its failed piece stays current
    expected = [(c.text_sha256, (c.text, c.n_tokens, ref(c, lang))) for c, lang in
                [(b[0], "de"), (b1_second, "de"), (c0, "fr")]]
    carried = [Rejected("b", 1, "too_long", "piece")]
    check_way(SkipDelivered(*args), docs, expected, carried)
    try:
        check_way(SkipDeliveredStream("run-t", *args), docs, expected, carried)
    finally:
        runscoped.discard("run-t")

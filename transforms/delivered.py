"""What DIR already delivered, by row: `--resume` sends only the chunks no earlier run
delivered (by doc_id and chunk_index: what was delivered is known by row, whatever text it
was sent as). A chunk that the service made us re-split may be partly delivered: its other
pieces are in the last run's pending rows (sent now) or failed rows (which stay current).

Two ways, as for dedupe (transforms/dedupe.py):
- SkipDelivered: a CoGroupByKey by doc_id of this run's documents with DIR's delivered rows;
  exact on any runner, but on the local runner the grouped documents are held in memory.
- SkipDeliveredStream (one process): the process reads DIR's delivered (doc_id, chunk_index)
  into a KeyIndex (~30 bytes a row) once, and documents pass through it as they stream.
"""
from __future__ import annotations

import threading
from typing import Iterator, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems
from apache_beam.io.parquetio import ReadAllFromParquetBatched, ReadFromParquetBatched
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from transforms import runscoped
from transforms.keyindex import KeyIndex, key16
from transforms.read import pending_entries
from transforms.records import Rejected
from transforms.source import matching_rows
from transforms.splitting import Chunk

PIECES, CARRIED = "pieces", "carried"


def _delivered_pairs(table: pa.Table):
    yield from zip(table.column("doc_id").to_pylist(), table.column("chunk_index").to_pylist())


def _pending_by_doc(table: pa.Table, kept_names: tuple):
    for sha, (text, n_tokens, ref) in pending_entries(table, kept_names):
        yield ref.doc_id, (ref.chunk_index, (sha, (text, n_tokens, ref)))


def _failed_chunks(table: pa.Table):
    for row in table.to_pylist():
        if row["doc_id"] is not None and row["chunk_index"] is not None:
            yield row["doc_id"], Rejected(row["doc_id"], row["chunk_index"], row["reason"], row["detail"])


def _undelivered(joined):
    doc_id, groups = joined
    done = set(groups["done"])
    pending = [(i, entry) for i, entry in groups["pending"] if i in done]
    failed = [r for r in groups["failed"] if r.chunk_index in done]
    for chunks, kept in groups["docs"]:
        left = tuple(c for c in chunks if c.chunk_index not in done)
        if left:
            yield doc_id, (left, kept)
    # A chunk re-split after an over-length answer may be partly delivered: its other pieces
    # are in the last run's pending rows (sent now) or failed rows (which stay current).
    for _, entry in pending:
        yield beam.pvalue.TaggedOutput(PIECES, entry)
    for rejected in failed:
        yield beam.pvalue.TaggedOutput(CARRIED, rejected)


class SkipDelivered(beam.PTransform):
    """(doc_id, (chunks, kept)) minus the chunks DIR's embeddings already hold, by
    (doc_id, chunk_index): what was delivered is known by row, whatever text it was sent as.
    Tagged `pieces`: the last run's pending pieces of partly delivered chunks, as chunk
    entries; tagged `carried`: their failed pieces."""

    def __init__(self, embeddings_glob: str, last_pending: Sequence[str], last_failed: Sequence[str],
                 kept_names: Sequence[str]):
        super().__init__()
        self._glob, self._kept = embeddings_glob, tuple(kept_names)
        self._pending, self._failed = list(last_pending), list(last_failed)

    def expand(self, docs):
        p = docs.pipeline
        done = (p | "ReadDelivered" >> ReadFromParquetBatched(self._glob, columns=["doc_id", "chunk_index"])
                | "DeliveredPairs" >> beam.FlatMap(_delivered_pairs))
        pending = (p | "LastPending" >> beam.Create(self._pending) | "ReadPending" >> ReadAllFromParquetBatched()
                   | "PendingByDoc" >> beam.FlatMap(_pending_by_doc, self._kept))
        failed = (p | "LastFailed" >> beam.Create(self._failed) | "ReadFailed" >> ReadAllFromParquetBatched()
                  | "FailedChunks" >> beam.FlatMap(_failed_chunks))
        return ({"docs": docs, "done": done, "pending": pending, "failed": failed}
                | "CoGroupByDoc" >> beam.CoGroupByKey()
                | "Undelivered" >> beam.FlatMap(_undelivered).with_outputs(PIECES, CARRIED, main="docs"))


def row_key(doc_id: str, chunk_index: int) -> bytes:
    return key16(f"{doc_id}\x00{chunk_index}")


def _parquet_files(pattern_or_paths: str | Sequence[str]) -> list[str]:
    patterns = [pattern_or_paths] if isinstance(pattern_or_paths, str) else list(pattern_or_paths)
    return sorted(m.path for result in FileSystems.match(patterns) for m in result.metadata_list)


def _row_groups(path: str, columns: Sequence[str]) -> Iterator[pa.Table]:
    with FileSystems.open(path) as fh:
        parquet = pq.ParquetFile(fh)
        for g in range(parquet.metadata.num_row_groups):
            yield parquet.read_row_group(g, columns=list(columns))


def delivered_index(embeddings_glob: str) -> KeyIndex:
    """Every (doc_id, chunk_index) that the embeddings files of EMBEDDINGS_GLOB hold."""
    index = KeyIndex()
    for path in _parquet_files(embeddings_glob):
        for table in _row_groups(path, ["doc_id", "chunk_index"]):
            for pair in _delivered_pairs(table):
                index.put(row_key(*pair))
    return index


class _SkipDeliveredChunks(beam.DoFn):
    """Documents minus their delivered chunks. Once the documents have passed (finish_bundle,
    once a run), the last run's pending rows of delivered chunks follow as one-chunk documents
    and its failed ones as `carried`: merging them with a Flatten would hold every document
    in memory on the local runner."""

    def __init__(self, run_id: str, embeddings_glob: str, last_files: tuple, kept_names: tuple):
        self._run_id, self._glob, self._last_files, self._kept = run_id, embeddings_glob, last_files, kept_names
        self._skipped = Metrics.counter("embedpipe", "chunks_delivered_before")

    def setup(self):
        glob = self._glob
        self._delivered = runscoped.shared(self._run_id, "delivered", lambda: delivered_index(glob))

    def process(self, doc):
        doc_id, (chunks, kept) = doc
        left = tuple(c for c in chunks if row_key(doc_id, c.chunk_index) not in self._delivered)
        self._skipped.inc(len(chunks) - len(left))
        if left:
            yield doc_id, (left, kept)

    def finish_bundle(self):
        if not runscoped.shared(self._run_id, "pieces", threading.Lock).acquire(blocking=False):
            return   # another bundle of this run in this process sent them (never released)
        for kind, path in self._last_files:
            for table in self._rows_of_delivered_chunks(path):
                yield from (self._pieces(table) if kind == "pending" else self._carried(table))

    def _rows_of_delivered_chunks(self, path: str) -> Iterator[pa.Table]:
        """PATH's rows of chunks DIR delivered; texts are read only where a row group holds one
        (a budget-stopped run's pending rows can be most of the corpus)."""
        def delivered(keys: pa.Table) -> pa.Array:
            return pa.array([doc_id is not None and index is not None and row_key(doc_id, index) in self._delivered
                             for doc_id, index in _delivered_pairs(keys)], pa.bool_())
        return matching_rows(path, ["doc_id", "chunk_index"], delivered)

    def _pieces(self, table: pa.Table):
        for sha, (text, n_tokens, ref) in pending_entries(table, self._kept):
            chunk = Chunk(ref.doc_id, ref.chunk_index, ref.chunk_count, ref.token_start, ref.token_end,
                          n_tokens, text, sha)
            yield WindowedValue((ref.doc_id, ((chunk,), ref.kept)), MIN_TIMESTAMP, [GlobalWindow()])

    def _carried(self, table: pa.Table):
        for _, rejected in _failed_chunks(table):
            yield beam.pvalue.TaggedOutput(CARRIED, WindowedValue(rejected, MIN_TIMESTAMP, [GlobalWindow()]))


class SkipDeliveredStream(beam.PTransform):
    """As SkipDelivered, in one process and without grouping (local runner, streaming): main
    `docs` (the pieces of partly delivered chunks among them), tagged `carried`."""

    def __init__(self, run_id: str, embeddings_glob: str, last_pending: Sequence[str],
                 last_failed: Sequence[str], kept_names: Sequence[str]):
        super().__init__()
        files = tuple(("pending", f) for f in last_pending) + tuple(("failed", f) for f in last_failed)
        self._fn = _SkipDeliveredChunks(run_id, embeddings_glob, files, tuple(kept_names))

    def expand(self, docs):
        return docs | "SkipDeliveredChunks" >> beam.ParDo(self._fn).with_outputs(CARRIED, main="docs")

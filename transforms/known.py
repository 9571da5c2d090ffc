"""Never pay twice: texts whose vectors already exist are taken from there, not sent again.

Sources, keyed by text_sha256 and anti-joined with this run's texts (CoGroupByKey, so it
scales like any shuffle instead of holding a set in memory):
- `--resume`: the embeddings files already in DIR. Rows delivered there are skipped
  (SkipDelivered, by doc_id and chunk_index); other rows with the same text get that vector
  at no cost.
- the journal of a run that was killed: paid for but never written out. Its rows are written
  now, with the original request id and cost share. The entries are read by the job, one
  file at a time; the driver only lists them.
- `--known GLOB`: embeddings files of other runs, reused at no cost.
"""
from __future__ import annotations

from typing import Iterator, NamedTuple, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.io.parquetio import ReadAllFromParquetBatched, ReadFromParquetBatched
from apache_beam.metrics import Metrics

from transforms import journal
from transforms.lineage import embeddings_table
from transforms.read import pending_entries
from transforms.records import Rejected, TextItem

REUSED = "reused"


class Known(NamedTuple):
    vector: bytes            # float32 little-endian
    request_id: str | None
    share_micro: int         # > 0 only for journaled, never-written rows


class _KnownRows(beam.DoFn):
    """Embeddings tables of earlier outputs -> (sha, Known), only for this model and length."""

    def __init__(self, model: str, dims: int):
        self._model, self._dims = model, dims

    def process(self, table: pa.Table):
        emb = table.column("embedding").combine_chunks()
        if emb.type.list_size != self._dims:
            return
        vectors = emb.flatten().to_numpy(zero_copy_only=False).astype("<f4").reshape(-1, self._dims)
        cols = [table.column(c).to_pylist() for c in ("text_sha256", "model", "request_id")]
        for i, (sha, model, request_id) in enumerate(zip(*cols)):
            if model == self._model:
                yield sha, Known(vectors[i].tobytes(), request_id, 0)


def journal_known(path: str) -> Iterator[tuple[str, Known]]:
    """A journal entry's texts: (sha, their vector, the request that paid, its share)."""
    request, table = journal.read_path(path)
    vectors = journal.entry_vectors(table)
    for i, (sha, share) in enumerate(zip(table.column("text_sha256").to_pylist(),
                                         table.column("share_micro").to_pylist())):
        yield sha, Known(vectors[i].tobytes(), request["request_id"], share)


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


class _AntiJoin(beam.DoFn):
    def __init__(self):
        self._reused = Metrics.counter("embedpipe", "chunks_reused")

    def process(self, joined):
        sha, groups = joined
        items, known = list(groups["items"]), list(groups["known"])
        if not items:
            return
        item = items[0]
        if not known:
            yield item
            return
        self._reused.inc(len(item.refs))
        best = max(known, key=lambda k: k.share_micro)  # a journaled entry carries its cost share
        if best.share_micro and any(k.request_id == best.request_id and not k.share_micro for k in known):
            best = best._replace(share_micro=0)  # DIR holds this text under that request: share written
        yield beam.pvalue.TaggedOutput(REUSED, (item, best))


class AntiJoinKnown(beam.PTransform):
    """TextItems x known vectors -> main: TextItems still to send; `reused`: (TextItem, Known)."""

    def __init__(self, model: str, dims: int, resume_glob: str | None, known_globs: Sequence[str],
                 journal_paths: Sequence[str]):
        super().__init__()
        self._model, self._dims = model, dims
        self._sources = ([resume_glob] if resume_glob else []) + list(known_globs)
        self._journal = list(journal_paths)

    def expand(self, items):
        p = items.pipeline
        known = [p | "JournalEntries" >> beam.Create(self._journal) | "SpreadEntries" >> beam.Reshuffle()
                 | "ReadJournal" >> beam.FlatMap(journal_known)]
        for i, glob in enumerate(self._sources):
            known.append(p | f"ReadKnown{i}" >> ReadFromParquetBatched(
                glob, columns=["text_sha256", "model", "request_id", "embedding"])
                | f"KnownRows{i}" >> beam.ParDo(_KnownRows(self._model, self._dims)))
        all_known = known | "AllKnown" >> beam.Flatten()
        keyed = items | "KeyItems" >> beam.Map(lambda item: (item.text_sha256, item))
        return ({"items": keyed, "known": all_known}
                | "CoGroup" >> beam.CoGroupByKey()
                | "AntiJoin" >> beam.ParDo(_AntiJoin()).with_outputs(REUSED, main="items"))


def reused_tables(batch: Sequence[tuple[TextItem, Known]], dims: int, schema: pa.Schema, model: str,
                  run_id: str, kept, embedded_at) -> pa.Table:
    items = [item for item, _ in batch]
    vectors = np.frombuffer(b"".join(k.vector for _, k in batch), dtype="<f4").reshape(len(batch), dims)
    return embeddings_table(items, vectors, [k.request_id for _, k in batch],
                            [k.share_micro for _, k in batch], schema, model, run_id, kept, embedded_at)

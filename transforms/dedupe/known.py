"""Never pay twice: texts whose vectors already exist are taken from there, not sent again.

Sources, keyed by text_sha256:
- DIR's history: every embeddings row an earlier run wrote, current or not (an unchanged
  chunk of an edited document, a text a removed document had): reused at no cost.
- the journal of a run that was killed: paid for but never written out. Its rows are written
  now, with the original request id and cost share. The entries are read by the job, one
  file at a time; the driver only lists them.
- `--known GLOB`: embeddings files of other runs, reused at no cost.

Two ways, as for distinct texts (transforms/dedupe/transform.py chooses), to find a text's
place (ReuseRef):
- AntiJoinKnown: a CoGroupByKey of this run's texts with every known text's digest and
  place; exact on any runner, no vector crosses it.
- ReuseKnownStream (the local runner): each process reads the sources' digests into a
  KnownIndex (~50 bytes a text) once; texts pass through it as they stream.
Either way a reused text's vector is read afterwards from its place, a row group at a time
(FetchReused), so vectors never gather.

Why not the library's PaidStore (store.py): a CLI run has a driver before and after its job.
The index is built once from what the driver listed and knows shares (a journaled text no file
holds carries its share, which this run's rows must write); repeats within the run are the
claims' (distinct.py: late rows copy the first row's outcome after the job). When a bundle
fails: the local runner does not retry (the job fails; --resume indexes its journal), and a
retried bundle after the grouping finds a request it packs as before by its id in the run's
journal (recall). The library has no driver: its store indexes each answer as it is paid, so a
retried bundle finds it by text, however it packs.
"""
from __future__ import annotations

import collections
import struct
from typing import NamedTuple
from collections.abc import Iterator, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.metrics import Metrics

from transforms.money import journal
from transforms.money.lineage import embeddings_table
from transforms.read.parquet import open_parquet, parquet_file
from transforms.records import TextItem
from transforms.worker import coders, runscoped  # noqa: F401  (coders: the coder of pa.Table)
from transforms.worker.keyindex import KeyIndex, key16

REUSED = "reused"
KNOWN_COLUMNS = ("text_sha256", "model", "request_id", "embedding")   # an embeddings file's, for reuse


class KnownStores(NamedTuple):
    """Where the vectors already paid for are, for one run (SCOPE: its in-process index):
    embeddings FILES and journal entries, of MODEL at DIMS only."""
    scope: str
    model: str
    dims: int
    files: tuple[str, ...]
    journal: tuple[str, ...]

    @property
    def any(self) -> bool:
        return bool(self.files or self.journal)


class ReuseRef(NamedTuple):
    """Where a known text's vector is (an embeddings file's row group and row, or a journal
    entry's row), the request that paid for it and the share its rows carry (> 0 only for a
    journaled text no file holds: paid, never written)."""
    path: str
    row_group: int
    row: int
    request_id: str | None
    share_micro: int
    journaled: bool


def read_vectors(path: str, row_group: int, journaled: bool) -> np.ndarray:
    """The float32 vectors of one row group of an embeddings file, or of a journal entry."""
    if journaled:
        return journal.entry_vectors(journal.read_path(path, ["embedding"])[1])
    with open_parquet(path) as fh:
        column = parquet_file(fh).read_row_group(row_group, columns=["embedding"]).column(0)
    column = column.combine_chunks()
    return column.flatten().to_numpy(zero_copy_only=False).astype("<f4").reshape(len(column), -1)


def _stored(path: str, model: str, dims: int) -> Iterator[tuple[int, int, str, str | None]]:
    """(row group, row, text_sha256, request_id) of PATH's rows of MODEL at DIMS."""
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        if parquet.schema_arrow.field("embedding").type.list_size != dims:
            return
        for g in range(parquet.metadata.num_row_groups):
            table = parquet.read_row_group(g, columns=["text_sha256", "model", "request_id"])
            columns = (table.column(c).to_pylist() for c in ("text_sha256", "model", "request_id"))
            for row, (sha, row_model, request_id) in enumerate(zip(*columns, strict=True)):
                if row_model == model:
                    yield g, row, sha, request_id


def _journaled(path: str) -> Iterator[tuple[int, str, str, int]]:
    """(row, text_sha256, request_id, share) of a journal entry's texts."""
    request, table = journal.read_path(path, ["text_sha256", "share_micro"])
    for row, (sha, share) in enumerate(zip(table.column("text_sha256").to_pylist(),
                                           table.column("share_micro").to_pylist(), strict=True)):
        yield row, sha, request["request_id"], share


# -- distributed runners: a join of digests ---------------------------------------------------

def _stored_refs(path: str, model: str, dims: int):
    for g, row, sha, request_id in _stored(path, model, dims):
        yield sha, ReuseRef(path, g, row, request_id, 0, False)


def _journal_refs(path: str):
    for row, sha, request_id, share in _journaled(path):
        yield sha, ReuseRef(path, 0, row, request_id, share, True)


def best_ref(refs: Sequence[ReuseRef]) -> ReuseRef:
    """A journaled share wins (the text was paid and never written), the largest if several;
    it is 0 when a file holds the text under that request (its share is written there)."""
    best = max(refs, key=lambda r: r.share_micro)
    if best.share_micro and any(not r.journaled and r.request_id == best.request_id for r in refs):
        best = best._replace(share_micro=0)
    return best


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
        yield beam.pvalue.TaggedOutput(REUSED, (item, best_ref(known)))


class AntiJoinKnown(beam.PTransform):
    """TextItems x known texts -> main: TextItems still to send; `reused`: (TextItem, ReuseRef).
    Only digests and places cross the join, never a vector: FetchReused reads the vectors."""

    def __init__(self, stores: KnownStores):
        super().__init__()
        self._stores = stores

    def expand(self, items):
        p, stores = items.pipeline, self._stores
        journaled = (p | "JournalEntries" >> beam.Create(list(stores.journal)) | "SpreadEntries" >> beam.Reshuffle()
                     | "ReadJournal" >> beam.FlatMap(_journal_refs))
        stored = (p | "KnownFiles" >> beam.Create(list(stores.files)) | "SpreadFiles" >> beam.Reshuffle()
                  | "ReadKnown" >> beam.FlatMap(_stored_refs, stores.model, stores.dims))
        all_known = (journaled, stored) | "AllKnown" >> beam.Flatten()
        keyed = items | "KeyItems" >> beam.Map(lambda item: (item.text_sha256, item))
        return ({"items": keyed, "known": all_known}
                | "CoGroup" >> beam.CoGroupByKey()
                | "AntiJoin" >> beam.ParDo(_AntiJoin()).with_outputs(REUSED, main="items"))


# -- the local runner, streaming ---------------------------------------------------------------

_ENTRY = struct.Struct("<iiiiq")   # request id's number, file, row group, row, share


class KnownIndex:
    """The known texts of a run, by digest: the place of each one's vector, never the vector;
    which place when several hold it, as best_ref decides."""

    def __init__(self, model: str, dims: int, files: Sequence[str], journal_paths: Sequence[str]):
        self.files = list(files)
        self._journal_from = len(self.files)
        self.files += list(journal_paths)
        self._request_ids: list[str | None] = []
        self._request_numbers: dict[str | None, int] = {}
        self._texts = KeyIndex()
        self._written = KeyIndex() if journal_paths else None   # (text, request) pairs in files
        for file in range(self._journal_from):
            for g, row, sha, request_id in _stored(self.files[file], model, dims):
                key = key16(sha)
                if key not in self._texts:
                    self._texts.put(key, _ENTRY.pack(self._number(request_id), file, g, row, 0))
                if self._written is not None:
                    self._written.put(key16(f"{sha}\x00{request_id}"))
        for file in range(self._journal_from, len(self.files)):
            for row, sha, request_id, share in _journaled(self.files[file]):
                key = key16(sha)
                held = self._texts.get(key)
                if held is None or _ENTRY.unpack(held)[4] < share:
                    self._texts.put(key, _ENTRY.pack(self._number(request_id), file, 0, row, share))

    def _number(self, request_id: str | None) -> int:
        if request_id not in self._request_numbers:
            self._request_numbers[request_id] = len(self._request_ids)
            self._request_ids.append(request_id)
        return self._request_numbers[request_id]

    def lookup(self, sha: str) -> ReuseRef | None:
        held = self._texts.get(key16(sha))
        if held is None:
            return None
        number, file, row_group, row, share = _ENTRY.unpack(held)
        request_id = self._request_ids[number]
        if share and self._written is not None and key16(f"{sha}\x00{request_id}") in self._written:
            share = 0   # DIR holds this text under that request: its share is written there
        return ReuseRef(self.files[file], row_group, row, request_id, share, file >= self._journal_from)


def known_index(stores: KnownStores) -> KnownIndex:
    """The run's KnownIndex in this process, built on first use."""
    return runscoped.shared(stores.scope, "known",
                            lambda: KnownIndex(stores.model, stores.dims, stores.files, stores.journal))


def known_vector(stores: KnownStores, sha: str) -> tuple[np.ndarray, ReuseRef] | None:
    """A text's vector from the stores (a piece the service made us split, say), and where it
    was; None when no store holds it."""
    ref = known_index(stores).lookup(sha)
    return None if ref is None else (read_vectors(ref.path, ref.row_group, ref.journaled)[ref.row], ref)


class _ReuseKnown(beam.DoFn):
    def __init__(self, stores: KnownStores):
        self._stores = stores
        self._reused = Metrics.counter("embedpipe", "chunks_reused")

    def setup(self):
        self._index = known_index(self._stores)

    def process(self, item: TextItem):
        ref = self._index.lookup(item.text_sha256)
        if ref is None:
            yield item
        else:
            self._reused.inc(len(item.refs))
            yield beam.pvalue.TaggedOutput(REUSED, (item, ref))


class ReuseKnownStream(beam.PTransform):
    """TextItem -> main: the TextItems still to send; `reused`: (TextItem, ReuseRef)."""

    def __init__(self, stores: KnownStores):
        super().__init__()
        self._fn = _ReuseKnown(stores)

    def expand(self, items):
        return items | "ReuseKnown" >> beam.ParDo(self._fn).with_outputs(REUSED, main="items")


class _ReusedTables(beam.DoFn):
    """Batches of (TextItem, ReuseRef) -> embeddings tables, each row group read once a batch;
    the last few stay cached (a resumed run meets its texts in the order it paid for them)."""

    CACHED = 4

    def __init__(self, table_args: tuple):
        self._table_args = table_args

    def setup(self):
        self._cache: collections.OrderedDict = collections.OrderedDict()

    def _vectors(self, ref: ReuseRef) -> np.ndarray:
        place = (ref.path, ref.row_group, ref.journaled)
        if place in self._cache:
            self._cache.move_to_end(place)
        else:
            self._cache[place] = read_vectors(*place)
            if len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        return self._cache[place]

    def process(self, batch):
        batch = sorted(batch, key=lambda pair: (pair[1].path, pair[1].row_group, pair[1].row))
        vectors = np.stack([self._vectors(ref)[ref.row] for _, ref in batch])
        yield embeddings_table([item for item, _ in batch], vectors, [ref.request_id for _, ref in batch],
                               [ref.share_micro for _, ref in batch], *self._table_args)


class FetchReused(beam.PTransform):
    """(TextItem, ReuseRef) -> embeddings tables with the known vectors, read from where they are."""

    def __init__(self, model: str, run_id: str, schema: pa.Schema, kept, embedded_at, per_table: int):
        super().__init__()
        self._fn = _ReusedTables((schema, model, run_id, kept, embedded_at))
        self._per_table = per_table

    def expand(self, reused):
        return (reused
                | "BatchReused" >> beam.BatchElements(min_batch_size=1, max_batch_size=self._per_table)
                | "ReusedTables" >> beam.ParDo(self._fn).with_output_types(pa.Table))

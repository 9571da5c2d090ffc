"""Read: Parquet row groups -> each document that needs work, split into chunks (or a
rejection), keyed by doc id; what changed against DIR's current view (transforms/read/changes.py)
comes out beside them, one small record per document worked on.

Works on whole Arrow tables so that tokenisation is batched (tiktoken's threads) and Beam's
per-element cost is paid per document, not per row value. An unchanged document is only
hashed, never tokenised.
"""
from __future__ import annotations

from typing import NamedTuple
from collections.abc import Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.metrics import Metrics

from service.tokenizer import get_encoding
from transforms.read.changes import EDITED, RESUMED, UNCHANGED, DocIndex, changes_table, classify, fingerprint
from transforms.read.parquet import Partition, Pull, ReadParquetTables
from transforms.read.rows import text_rejection
from transforms.read.split import SplitConfig, Splitter
from transforms.read.stamps import Stamp
from transforms.records import ChunkRef, Rejected
from transforms.worker import collector, runscoped
from transforms.worker.progress import Progress

ENTRIES, REJECTED, CHANGED = "entries", "rejected", "changed"
# documents are reported read as their chunks go on to be packed and sent, this many at a time:
# the progress line's requests planned and documents read move together (a row group is thousands)
REPORT_DOCUMENTS = 32


def _id_strings(column: pa.ChunkedArray) -> list:
    """Ids as the outputs write them (ReadParquetTables made string-like columns `string`)."""
    return (column if pa.types.is_string(column.type) else column.cast(pa.string())).to_pylist()


def _texts(column: pa.ChunkedArray) -> tuple[list, dict[int, str]]:
    """The column as Python strings; rows whose bytes are not valid UTF-8 (Arrow does not
    check what writers put in a string column) come back as None, with the reason by row."""
    try:
        return column.to_pylist(), {}
    except UnicodeDecodeError:
        texts, invalid = [], {}
        for i, raw in enumerate(column.cast(pa.binary()).to_pylist()):
            try:
                texts.append(None if raw is None else raw.decode("utf-8"))
            except UnicodeDecodeError as exc:
                texts.append(None)
                invalid[i] = f"the text is not valid UTF-8 ({exc.reason} at byte {exc.start})"
        return texts, invalid


class ViewRef(NamedTuple):
    """What the workers need of DIR's current view: its document index (None: no view yet),
    the signature of its versions, and the scope of the in-process index (the run id);
    OTHER, the signature of the same chunking with the other text setting (a document served
    under it is rewritten, not edited)."""
    docindex: str | None
    signature: bytes
    scope: str
    other: bytes | None = None


def chunk_entries(doc_id: str, chunks, extra: tuple = ()):
    """What Dedupe takes, per chunk of one document: (text_sha256, (text, n_tokens, ChunkRef))."""
    for c in chunks:
        ref = ChunkRef(doc_id, c.chunk_index, c.chunk_count, c.token_start, c.token_end, c.n_tokens, extra)
        yield c.text_sha256, (c.text, c.n_tokens, ref)


class _SplitTable(beam.DoFn):
    """One Arrow table in; per chunk of a row that needs work, (text_sha256, (text, n_tokens,
    ChunkRef)), or a tagged Rejected for the row; a tagged `changed` table (CHANGES_SCHEMA) of
    the rows that need work: one element for the table, not one a row (2 us of CPU a row less)."""

    def __init__(self, id_column: str, text_column: str, keep_columns: Sequence[str], split: SplitConfig,
                 duplicate_ids: Mapping[str, int], view: ViewRef, progress: tuple[str, str, float] | None):
        self._id_column, self._text_column = id_column, text_column
        self._progress_of = progress  # (output dir, run id, interval): where this worker reports
        self._keep_columns = tuple(keep_columns)
        self._split = split
        self._duplicate_ids = dict(duplicate_ids)
        self._view = view
        self._rows = Metrics.counter("embedpipe", "documents")
        self._chunks = Metrics.counter("embedpipe", "chunks")

    def setup(self):
        collector.tune_once()
        self._splitter = Splitter(get_encoding(), self._split)
        self._progress = Progress.for_run(*self._progress_of) if self._progress_of else None
        view = self._view
        self._index = runscoped.shared(view.scope, "docindex", lambda: DocIndex(view.docindex))

    def _version(self, signature: bytes, doc_id, text, extra, row: int, invalid: dict) -> bytes:
        if doc_id in self._duplicate_ids:
            return fingerprint(signature, None, (), f"duplicate:{self._duplicate_ids[doc_id]}")
        if row in invalid:
            return fingerprint(signature, None, (), invalid[row])
        return fingerprint(signature, text, tuple(extra))

    def _change(self, doc_id, text, extra, row: int, invalid: dict) -> tuple[str, tuple[int, ...] | None, bytes]:
        """(change, the chunks to send: None for all, the version) of one input row."""
        view = self._view
        version = self._version(view.signature, doc_id, text, extra, row, invalid)
        entry = self._index.get(doc_id)
        change, todo = classify(entry, version)
        if change == EDITED and view.other is not None:   # hashed again only when it differs
            change, todo = classify(entry, version, self._version(view.other, doc_id, text, extra, row, invalid))
        return change, todo, version

    def process(self, table: pa.Table):
        ids = _id_strings(table.column(self._id_column))
        texts, invalid = _texts(table.column(self._text_column))
        kept = list(zip(*(table.column(c).to_pylist() for c in self._keep_columns), strict=True)) or [()] * len(ids)
        self._rows.inc(len(ids))
        valid: list[tuple[str, str, tuple]] = []   # (doc_id, text, kept values)
        todos: list[tuple[int, ...] | None] = []
        changed_ids, changes, versions = [], [], []
        for row, (doc_id, text, extra) in enumerate(zip(ids, texts, kept, strict=True)):
            if doc_id is None:  # no id: nothing to match across runs; a failed row every time
                yield beam.pvalue.TaggedOutput(REJECTED, Rejected(None, None, "null_id", "the id column is null"))
                continue
            change, todo, version = self._change(doc_id, text, extra, row, invalid)
            if change == UNCHANGED:
                continue
            changed_ids.append(doc_id)
            changes.append(change)
            versions.append(version)
            if doc_id in self._duplicate_ids:  # every row of a repeated id: ambiguity is not resolved
                rejection: Rejected | None = Rejected(doc_id, None, "duplicate_id",
                                                       f"id occurs {self._duplicate_ids[doc_id]} times in the input")
            elif row in invalid:
                rejection = Rejected(doc_id, None, "invalid_utf8", invalid[row])
            else:
                rejection = text_rejection(doc_id, text)
            if rejection is None:
                valid.append((doc_id, text, extra))
                todos.append(todo)
            else:
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        if changed_ids:
            yield beam.pvalue.TaggedOutput(CHANGED, changes_table(changed_ids, changes, versions))
        chunk_lists = self._splitter.split_many([(d, t) for d, t, _ in valid])
        read = len(ids) - len(valid)   # documents that need no request: read already
        for (doc_id, _, extra), chunks, todo in zip(valid, chunk_lists, todos, strict=True):
            if todo is not None:   # resumed: only the chunks still pending
                chunks = [c for c in chunks if c.chunk_index in todo]
            self._chunks.inc(len(chunks))
            yield from chunk_entries(doc_id, chunks, tuple(extra))
            read += 1
            if read >= REPORT_DOCUMENTS and self._progress:
                self._progress.add(documents=read)
                read = 0
        if self._progress:
            self._progress.add(documents=read)


class ReadDocuments(beam.PTransform):
    """Parquet FILES (with their hive PARTITIONS) -> `entries`: (text_sha256, (text, n_tokens,
    ChunkRef)) per chunk of the documents that need work against VIEW; `rejected`: Rejected
    rows; `changed`: one record per document worked on.
    DUPLICATE_IDS (id -> count, from the driver's scan) are rejected without being split;
    PROGRESS (output dir, run id, interval) is where documents read are reported; SPREAD and
    STAMPS as ReadParquetTables'."""

    def __init__(self, files: Sequence[str], partitions: Sequence[Partition] | None, id_column: str,
                 text_column: str, keep_columns: Sequence[str], split: SplitConfig,
                 duplicate_ids: Mapping[str, int], view: ViewRef,
                 progress: tuple[str, str, float] | None = None, spread: bool | Pull = True,
                 stamps: Mapping[str, Stamp] | None = None):
        super().__init__()
        self._files, self._partitions, self._spread, self._stamps = list(files), partitions, spread, stamps
        self._columns = (id_column, text_column, *keep_columns)
        self._split_fn = _SplitTable(id_column, text_column, keep_columns, split, duplicate_ids, view, progress)

    def expand(self, pbegin):
        return (pbegin
                | "ReadParquet" >> ReadParquetTables(self._files, self._columns, self._partitions, self._spread,
                                                       self._stamps)
                | "Split" >> beam.ParDo(self._split_fn).with_outputs(REJECTED, CHANGED, main=ENTRIES))


def pending_entries(table: pa.Table, kept_names: tuple):
    cols = {name: table.column(name).to_pylist() for name in table.schema.names}
    kept = list(zip(*(cols[name] for name in kept_names), strict=True)) or [()] * table.num_rows
    for i in range(table.num_rows):
        ref = ChunkRef(cols["doc_id"][i], cols["chunk_index"][i], cols["chunk_count"][i],
                       cols["token_start"][i], cols["token_end"][i], cols["n_tokens"][i], tuple(kept[i]))
        yield cols["text_sha256"][i], (cols["text"][i], cols["n_tokens"][i], ref)


def _resumed(table: pa.Table) -> pa.Table:
    """Each document of a table of pending rows, once: it is resumed."""
    doc_ids = list(dict.fromkeys(table.column("doc_id").to_pylist()))
    return changes_table(doc_ids, [RESUMED] * len(doc_ids), [None] * len(doc_ids))


class ReadPending(beam.PTransform):
    """pending-*.parquet FILES of DIR's current view -> the outputs of ReadDocuments: their
    `entries`, no `rejected` (they were read and checked once), `changed`: their documents,
    resumed. What `--resume` without `--input` sends, without reading the corpus again."""

    def __init__(self, files: Sequence[str], columns: Sequence[str], kept_names: Sequence[str],
                 spread: bool | Pull = True):
        super().__init__()
        self._files, self._columns, self._kept = list(files), list(columns), tuple(kept_names)
        self._spread = spread

    def expand(self, pbegin):
        tables = pbegin | "ReadPendingParquet" >> ReadParquetTables(self._files, self._columns, spread=self._spread)
        entries = tables | "PendingEntries" >> beam.FlatMap(pending_entries, self._kept).with_outputs(
            REJECTED, main=ENTRIES)
        return {ENTRIES: entries[ENTRIES], REJECTED: entries[REJECTED],
                CHANGED: tables | "Resumed" >> beam.Map(_resumed)}

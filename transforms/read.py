"""Read: Parquet row groups -> each document's chunks (or a rejection), keyed by doc id.

Works on whole Arrow tables so that tokenisation is batched (tiktoken's threads) and Beam's
per-element cost is paid per document, not per row value.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.parquetio import ReadFromParquetBatched
from apache_beam.metrics import Metrics

from service.tokenizer import get_encoding
from transforms.progress import Progress
from transforms.records import ChunkRef, Rejected
from transforms.source import Partition, ReadParquetTables
from transforms.splitting import SplitConfig, Splitter

REJECTED = "rejected"


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


def _row_rejection(doc_id, text) -> Rejected | None:
    if doc_id is None:
        return Rejected(None, None, "null_id", "the id column is null")
    if text is None:
        return Rejected(doc_id, None, "null_text", "the text column is null")
    if not text.strip():
        return Rejected(doc_id, None, "empty_text", "the text is empty or whitespace only")
    return None


class _SplitTable(beam.DoFn):
    """One Arrow table in; (doc_id, (chunks, kept)) or a tagged Rejected out per row."""

    def __init__(self, id_column: str, text_column: str, keep_columns: Sequence[str], split: SplitConfig,
                 duplicate_ids: Mapping[str, int], progress: tuple[str, str, float] | None):
        self._id_column, self._text_column = id_column, text_column
        self._progress_of = progress  # (output dir, run id, interval): where this worker reports
        self._keep_columns = tuple(keep_columns)
        self._split = split
        self._duplicate_ids = dict(duplicate_ids)
        self._rows = Metrics.counter("embedpipe", "documents")
        self._chunks = Metrics.counter("embedpipe", "chunks")

    def setup(self):
        self._splitter = Splitter(get_encoding(), self._split)
        self._progress = Progress.for_run(*self._progress_of) if self._progress_of else None

    def process(self, table: pa.Table):
        ids = _id_strings(table.column(self._id_column))
        texts, invalid = _texts(table.column(self._text_column))
        kept = list(zip(*(table.column(c).to_pylist() for c in self._keep_columns))) or [()] * len(ids)
        self._rows.inc(len(ids))
        valid = []
        for row, (doc_id, text, extra) in enumerate(zip(ids, texts, kept)):
            if doc_id in self._duplicate_ids:  # every row of a repeated id: ambiguity is not resolved
                rejection = Rejected(doc_id, None, "duplicate_id",
                                     f"id occurs {self._duplicate_ids[doc_id]} times in the input")
            elif row in invalid and doc_id is not None:
                rejection = Rejected(doc_id, None, "invalid_utf8", invalid[row])
            else:
                rejection = _row_rejection(doc_id, text)
            if rejection is None:
                valid.append((doc_id, text, extra))
            else:
                yield beam.pvalue.TaggedOutput(REJECTED, rejection)
        chunk_lists = self._splitter.split_many([(d, t) for d, t, _ in valid])
        for (doc_id, _, extra), chunks in zip(valid, chunk_lists):
            self._chunks.inc(len(chunks))
            yield doc_id, (tuple(chunks), tuple(extra))
        if self._progress:
            self._progress.add(documents=len(ids))


class ReadDocuments(beam.PTransform):
    """Parquet FILES (with their hive PARTITIONS) -> main: (doc_id, (chunks, kept)); tagged
    `rejected`: Rejected rows.
    DUPLICATE_IDS (id -> count, from the driver's scan) are rejected without being split;
    PROGRESS (output dir, run id, interval) is where documents read are reported."""

    def __init__(self, files: Sequence[str], partitions: Sequence[Partition] | None, id_column: str,
                 text_column: str, keep_columns: Sequence[str], split: SplitConfig,
                 duplicate_ids: Mapping[str, int], progress: tuple[str, str, float] | None = None):
        super().__init__()
        self._files, self._partitions = list(files), partitions
        self._columns = (id_column, text_column, *keep_columns)
        self._split_fn = _SplitTable(id_column, text_column, keep_columns, split, duplicate_ids, progress)

    def expand(self, pbegin):
        return (pbegin
                | "ReadParquet" >> ReadParquetTables(self._files, self._columns, self._partitions)
                | "Split" >> beam.ParDo(self._split_fn).with_outputs(REJECTED, main="docs"))


def pending_entries(table: pa.Table, kept_names: tuple):
    cols = {name: table.column(name).to_pylist() for name in table.schema.names}
    kept = list(zip(*(cols[name] for name in kept_names))) or [()] * table.num_rows
    for i in range(table.num_rows):
        ref = ChunkRef(cols["doc_id"][i], cols["chunk_index"][i], cols["chunk_count"][i],
                       cols["token_start"][i], cols["token_end"][i], cols["n_tokens"][i], tuple(kept[i]))
        yield cols["text_sha256"][i], (cols["text"][i], cols["n_tokens"][i], ref)


class ReadPending(beam.PTransform):
    """pending-*.parquet of an earlier run -> (text_sha256, (text, n_tokens, ChunkRef)): what
    `--resume` without `--input` sends, without reading the corpus again."""

    def __init__(self, file_pattern: str, kept_names: Sequence[str]):
        super().__init__()
        self._pattern, self._kept = file_pattern, tuple(kept_names)

    def expand(self, pbegin):
        return (pbegin
                | "ReadPendingParquet" >> ReadFromParquetBatched(self._pattern)
                | "PendingEntries" >> beam.FlatMap(pending_entries, self._kept))

"""ReadParquetTables: Parquet files (with hive partition values) -> Arrow tables of a row group.

A drop-in for ReadFromParquetBatched (same element type, pa.Table) that also takes what a
dataset directory means: partition keys as columns. Each file's partition values come from
its path (`lang=en/part-0.parquet`), resolved in the driver (pipeline/checks/inputs.py), and are
appended as constant string columns: the text of the path, never a guessed type, so
`month=01` stays "01". Files are read through Beam's FileSystems, so gs:// and s3:// work.

String-like columns come out as plain `string` (from large_string, string_view, or
dictionary-encoded strings), so the steps after it see one type whatever wrote the file.

Each file is checked, once open, against what the driver stamped when it listed it
(transforms/read/stamps.py); a read that fails is InputChanged when the file changed since,
else UnreadableInput naming the file and row group, never a bare pyarrow error.
"""
from __future__ import annotations

from typing import Any, NamedTuple
from collections.abc import Callable, Mapping, Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from transforms.read.stamps import INPUT_FILE, Stamp, check
from transforms.worker import coders  # noqa: F401  (registers the coder of pa.Table)

Partition = Mapping[str, "str | None"]


_is_string_view = getattr(pa.types, "is_string_view", lambda t: False)  # pyarrow >= 16


def _is_string_like(t: pa.DataType) -> bool:
    return pa.types.is_string(t) or pa.types.is_large_string(t) or _is_string_view(t)


def normalised_type(t: pa.DataType) -> pa.DataType:
    """The type a column has after the read: dictionary-encoded values decoded, strings plain."""
    if pa.types.is_dictionary(t):
        t = t.value_type
    return pa.string() if _is_string_like(t) else t


def normalise(column: pa.ChunkedArray) -> pa.ChunkedArray:
    target = normalised_type(column.type)
    return column if column.type == target else column.cast(target)


def open_parquet(path: str):
    return FileSystems.open(path, mime_type="application/octet-stream",
                            compression_type=CompressionTypes.UNCOMPRESSED)


class _InCallersThread(pq.ParquetFile):
    """Reads of several row groups without threads by default: with them, Arrow's CPU threads
    read the file too."""

    def read(self, columns=None, use_threads=False, use_pandas_metadata=False):
        return super().read(columns, use_threads, use_pandas_metadata)

    def read_row_groups(self, row_groups, columns=None, use_threads=False, use_pandas_metadata=False):
        return super().read_row_groups(row_groups, columns, use_threads, use_pandas_metadata)


def parquet_file(source) -> pq.ParquetFile:
    """pq.ParquetFile over an open file object (Beam's FileSystems handles, io.BytesIO), read in
    the caller's thread alone: an Arrow thread that touched a Python file may drop the last
    reference to it after the read returned, and at interpreter exit that aborts the process
    ("terminate called without an active exception", exit 134). Pre-buffering
    (pyarrow's default) reads on the IO threads. Pages whose writer set a checksum are verified:
    a corrupt page is an error, never wrong text."""
    return _InCallersThread(source, pre_buffer=False, page_checksum_verification=True)


def row_count(path: str) -> int:
    """Rows of the Parquet file at PATH, from its footer."""
    with open_parquet(path) as fh:
        return parquet_file(fh).metadata.num_rows


def read_whole(source, columns: Sequence[str] | None = None) -> pa.Table:
    """A Parquet file from an open file object, whole or COLUMNS of it, in the caller's thread
    (see parquet_file; pq.read_table's dataset reader pre-buffers). The files read here are
    small, or a few columns of larger ones."""
    return parquet_file(source).read(columns=None if columns is None else list(columns))


def read_tables(paths: Sequence[str], columns: Sequence[str]) -> list[pa.Table]:
    """COLUMNS of each Parquet file of PATHS, one table each."""
    tables = []
    for path in paths:
        with open_parquet(path) as fh:
            tables.append(read_whole(fh, columns))
    return tables


def matching_rows(path: str, key_columns: Sequence[str], match: Callable[[pa.Table], pa.Array]):
    """PATH's rows for which MATCH (of a table of KEY_COLUMNS) is true, a row group at a time:
    the key columns are read first, the whole row group (texts, vectors) only where a row matches."""
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        for g in range(parquet.metadata.num_row_groups):
            mask = match(parquet.read_row_group(g, columns=list(key_columns)))
            if pc.any(mask).as_py():
                yield parquet.read_row_group(g).filter(mask)


class UnreadableInput(Exception):
    """An input file pyarrow cannot read (a corrupt page, a failed page checksum) that did not
    change since it was listed: the message names it and where."""

    def __init__(self, path: str, where: str, exc: Exception):
        reason = " ".join(str(exc).split()) or type(exc).__name__
        super().__init__(f"{INPUT_FILE}{path} is not readable Parquet ({where}: {reason})")


def _checked(path: str, was: Stamp | None, where: str, read: Callable[[], Any]):
    """READ() of PATH; when it fails, InputChanged if PATH is not what WAS stamped, else
    UnreadableInput for what pyarrow cannot read (other errors as they are)."""
    try:
        return read()
    except (pa.ArrowException, OSError, ValueError) as exc:
        check(path, was)
        raise UnreadableInput(path, where, exc) from exc
    except Exception:
        check(path, was)
        raise


def row_groups(entry: tuple[str, dict], stamps: Mapping[str, Stamp] | None = None):
    """(path, partition) -> (path, row group index, partition) for each non-empty row group,
    so that a runner can spread the row groups of one large file over workers. STAMPS: what
    each file was when listed, checked once it is open."""
    path, partition = entry
    was = (stamps or {}).get(path)
    with open_parquet(path) as fh:
        check(path, was)
        meta = _checked(path, was, "footer", lambda: parquet_file(fh).metadata)
    for i in range(meta.num_row_groups):
        if meta.row_group(i).num_rows:
            yield path, i, partition


# Rows per table out of a row group: a writer's default row group (1Mi rows in pyarrow) would
# otherwise be one element, split as a whole and held at once. 512 rows of ~2 KB documents
# hold about one request's text: the Split step then keeps ~1 MB of texts and chunks at a time,
# and Beam's per-table cost stays negligible (2,000 tables for a million documents).
BATCH_ROWS = 512


def _batches(path: str, index: int, columns: Sequence[str], was: Stamp | None):
    """The row group's record batches, checked against WAS once the file is open."""
    where = f"row group {index}"
    with open_parquet(path) as fh:
        check(path, was)
        batches = _checked(path, was, where, lambda: parquet_file(fh).iter_batches(
            BATCH_ROWS, row_groups=[index], columns=columns))
        while (batch := _checked(path, was, where, lambda: next(batches, None))) is not None:
            yield batch


def read_row_group(ref: tuple[str, int, dict], columns: Sequence[str], keep: Callable[[int], bool] = lambda j: True,
                   stamps: Mapping[str, Stamp] | None = None):
    """The row group, as tables of at most BATCH_ROWS rows; KEEP(j) false skips the j-th.
    STAMPS: what each file was when listed (InputChanged when it is not that any more)."""
    path, index, partition = ref
    in_file = [c for c in columns if c not in partition]
    for j, batch in enumerate(_batches(path, index, in_file, (stamps or {}).get(path))):
        if not keep(j):
            continue
        n = batch.num_rows
        yield pa.Table.from_arrays(
            [normalise(pa.chunked_array([batch.column(c)])) if c in in_file
             else pa.chunked_array([pa.array([partition[c]] * n, pa.string())]) for c in columns],
            names=list(columns))


class Pull(NamedTuple):
    """The input pulled by the local runner's worker processes as each is ready for more, from
    one pool: a runner splits a stage's input among its workers once, at its start, so a process
    that sends fewer requests at once (its share of a service's capacity) would otherwise finish
    its half long after the other, and a file of one row group would go to one process. POOL:
    `take(key)` is true for the one caller that takes KEY, `taken(key)` whether one did
    (transforms/dedupe/claimfile.py); WORKERS: one puller each."""
    pool: Any
    workers: int


def pulled(_puller: int, entries: Sequence[tuple[str, dict]], pool: Any, columns: Sequence[str],
           stamps: Mapping[str, Stamp] | None = None):
    """The tables this puller takes first, every puller trying the same ones in the same order:
    whole row groups while any is left, each read by the one that takes it; then, started last
    first (the most left), the tables not taken yet of those still being read. Whoever reads a
    row group takes its tables one by one, in order, so two share its rest by their pace (the
    one that joins decodes it from its start: at most one row group per other puller, at the end)."""
    seen = []
    for entry in entries:
        for ref in row_groups(entry, stamps):
            seen.append(ref)
            if pool.take(_key(ref, "whole")):
                yield from _read_shared(ref, columns, pool, stamps)
    for ref in reversed(seen):
        if not pool.taken(_key(ref, "done")):
            yield from _read_shared(ref, columns, pool, stamps)


def _key(ref: tuple[str, int, dict], part: int | str) -> bytes:
    return f"{ref[0]}\0{ref[1]}\0{part}".encode()


def _read_shared(ref: tuple[str, int, dict], columns: Sequence[str], pool: Any, stamps: Mapping[str, Stamp] | None):
    yield from read_row_group(ref, columns, lambda j: pool.take(_key(ref, j)), stamps)
    pool.take(_key(ref, "done"))


class ReadParquetTables(beam.PTransform):
    """FILES (with PARTITIONS[i], the partition values of FILES[i], or none) -> pa.Tables of at
    most BATCH_ROWS rows of one row group, holding COLUMNS in that order; a partition key is a
    column like any other. SPREAD: the row groups are reshuffled so that a runner can share them
    among its workers (with one worker that is only a stage more, ~0.05 s before the first table),
    or pulled by the local runner's worker processes (a Pull). STAMPS: what each file was when
    the driver listed it; a file that is not that any more when opened fails the job."""

    def __init__(self, files: Sequence[str], columns: Sequence[str],
                 partitions: Sequence[Partition] | None = None, spread: bool | Pull = True,
                 stamps: Mapping[str, Stamp] | None = None):
        super().__init__()
        if partitions is not None and len(partitions) != len(files):
            raise ValueError("one partition mapping per file")
        self._entries = [(f, dict(p)) for f, p in zip(files, partitions or [{}] * len(files), strict=True)]
        self._columns = list(columns)
        self._spread = spread
        self._stamps = dict(stamps or {})

    def expand(self, pbegin):
        if isinstance(self._spread, Pull):
            return (pbegin
                    | "Pullers" >> beam.Create(range(self._spread.workers), reshuffle=True)
                    | "PullRowGroups" >> beam.FlatMap(pulled, self._entries, self._spread.pool, self._columns,
                                                      self._stamps).with_output_types(pa.Table))
        groups = (pbegin
                  | "Files" >> beam.Create(self._entries, reshuffle=self._spread)
                  | "RowGroups" >> beam.FlatMap(row_groups, self._stamps))
        if self._spread:
            groups = groups | "Spread" >> beam.Reshuffle()
        return groups | "ReadRowGroup" >> beam.FlatMap(read_row_group, self._columns,
                                                       stamps=self._stamps).with_output_types(pa.Table)

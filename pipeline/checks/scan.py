"""The driver's cheap pass over the input, before the Beam job: repeated ids, and an upper
bound of the text bytes from Parquet metadata alone.

Inside the job both would be barriers (a side input of id counts, a side input of the whole
run's worst case), making every document wait in memory until the last was split. Here the
ids column alone is read (a few bytes a row) and the texts are not read at all.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.checks import reading
from pipeline.checks.inputs import InputInfo
from pipeline.exits import JobFailed, UsageError
from transforms.read.parquet import normalise, open_parquet, parquet_file, read_whole
from transforms.read.stamps import InputChanged, Stamp, check

# Encodings whose uncompressed size cannot be smaller than the distinct values' bytes it holds:
# a PLAIN value is its bytes plus a length; a dictionary holds each distinct value PLAIN once.
# DELTA_BYTE_ARRAY shares prefixes between values, so its size says nothing about the bytes.
_BOUNDING_ENCODINGS = {"PLAIN", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "RLE", "BIT_PACKED"}


@dataclasses.dataclass(frozen=True)
class Scan:
    rows: int
    duplicate_ids: dict[str, int]  # id (as the output writes it) -> how often it occurs
    tokens_bound: int            # >= the cl100k tokens of the distinct texts: their UTF-8 bytes
                                 # (a token is at least one byte), or pending rows' own counts
    ids: pa.Array = dataclasses.field(default_factory=lambda: pa.array([], pa.string()))  # distinct


def _ids_as_strings(column: pa.ChunkedArray) -> pa.ChunkedArray:
    column = normalise(column)
    return column if pa.types.is_string(column.type) else column.cast(pa.string())


def _text_bytes_bound(pf: pq.ParquetFile, text_column: str) -> int | None:
    """Σ uncompressed size of the text column's chunks, or None when an encoding makes that no
    bound (the caller then measures the texts themselves)."""
    meta, total = pf.metadata, 0
    index = pf.schema_arrow.get_field_index(text_column)
    leaf = [i for i in range(meta.num_columns) if meta.schema.column(i).path.split(".")[0] == text_column]
    if index < 0 or len(leaf) != 1:
        return None
    for g in range(meta.num_row_groups):
        chunk = meta.row_group(g).column(leaf[0])
        if not set(chunk.encodings) <= _BOUNDING_ENCODINGS:
            return None
        total += chunk.total_uncompressed_size
    return total


def _measured_text_bytes(pf: pq.ParquetFile, text_column: str) -> int:
    total = 0
    for g in range(pf.metadata.num_row_groups):
        column = normalise(pf.read_row_group(g, columns=[text_column]).column(0))
        total += pc.sum(pc.binary_length(column)).as_py() or 0
    return total


def _scan_file(path: str, partition: dict[str, Any], id_column: str,
               text_column: str) -> tuple[int, list[pa.Array], int]:
    """PATH's rows, its ids (chunks of strings), a bound of its text bytes."""
    with open_parquet(path) as fh:
        pf = parquet_file(fh)
        n = pf.metadata.num_rows
        if id_column in partition:  # a hive key: every row of the file has the path's value
            ids = [pa.array([partition[id_column]] * n, pa.string())]
        else:
            ids = _ids_as_strings(pf.read(columns=[id_column]).column(0)).chunks
        bound = _text_bytes_bound(pf, text_column)
        return n, ids, bound if bound is not None else _measured_text_bytes(pf, text_column)


def _checked_scan(path: str, partition: dict[str, Any], id_column: str, text_column: str,
                  was: Stamp | None) -> tuple[int, list[pa.Array], int]:
    try:
        scanned = _scan_file(path, partition, id_column, text_column)
    except (pa.ArrowException, OSError, ValueError) as exc:
        check(path, was)
        raise UsageError(f"{path}: not a readable Parquet file ({' '.join(str(exc).split())}); nothing was "
                         f"sent: replace it with a readable copy.") from None
    check(path, was)
    return scanned


def scan_input(info: InputInfo, id_column: str, text_column: str) -> Scan:
    """The ids and the bound, each file checked against its stamp: a page that fails its checksum
    or cannot be decoded is found here, before anything is sent, when it is in what is read."""
    ids, rows, text_bytes = [], 0, 0
    stamps = info.stamp_map
    for path, partition in zip(info.files, info.partition_mappings or [{}] * len(info.files), strict=True):
        try:
            n, file_ids, bound = _checked_scan(path, partition, id_column, text_column, stamps.get(path))
        except InputChanged as exc:
            raise JobFailed(f"{exc}; nothing was sent: {reading.AGAIN}.") from None
        rows += n
        ids.extend(file_ids)
        text_bytes += bound
    counts = pc.value_counts(pa.chunked_array(ids, pa.string())) if ids else None
    duplicates, distinct = {}, pa.array([], pa.string())
    if counts is not None and len(counts):
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        duplicates = {v: n for v, n in zip(repeated.field("values").to_pylist(),
                                           repeated.field("counts").to_pylist(), strict=True) if v is not None}
        distinct = counts.field("values")
    return Scan(rows, duplicates, text_bytes, distinct)


def scan_pending(files: Sequence[str]) -> Scan:
    """--resume without --input: the last run's pending rows, whose tokens are counted already."""
    rows = tokens = 0
    for path in files:
        with open_parquet(path) as fh:
            column = read_whole(fh, ["n_tokens"]).column(0)
        rows += len(column)
        tokens += pc.sum(column).as_py() or 0
    return Scan(rows, {}, tokens)

"""Rows of the view's Arrow tables as a binary COPY takes them (no Beam, no database here).

The vector goes as pgvector's binary form (two big-endian uint16, dimensions and 0, then
big-endian float32s): the view's float32 bytes in another byte order, bit for bit, converted
for a whole batch at once. `cost_rub` goes as the numeric whose text is the shortest that
reads back as the same float64 (repr), so the table's value is the view's exactly; a decimal
column's values go as they are. The chunk's text goes as it is, or empty where the view lacks
it (a file written before rows carried it, or without it: a null, or no column).
"""
from __future__ import annotations

import decimal
import functools
import json
import struct
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from psycopg.types.json import Jsonb

from transforms.publish.columns import TEXT, Column


_dumps = functools.partial(json.dumps, default=str)   # dates and bytes nested in a kept value


def vector_payloads(column: pa.ChunkedArray | pa.Array, dimensions: int) -> list[bytes]:
    """Each row's vector in pgvector's binary form."""
    values = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    flat = values.flatten().to_numpy(zero_copy_only=False)
    if len(flat) != len(values) * dimensions:
        raise ValueError(f"vectors of {len(flat) / max(len(values), 1):g} values where the view has {dimensions}")
    big = flat.astype(">f4", copy=False).reshape(len(values), dimensions)
    head = struct.pack(">HH", dimensions, 0)
    return [head + row.tobytes() for row in big]


def _values(column: pa.ChunkedArray, col: Column) -> list[Any]:
    """COLUMN's values as COL's type takes them, converted by their Arrow type."""
    t = column.type
    if pa.types.is_dictionary(t):
        t = t.value_type
        column = column.cast(t)
    if pa.types.is_float16(t):   # as real, which holds each exactly
        column = column.cast(pa.float32())
    if col.type == "real[]" and pa.types.is_float16(t.value_type):
        column = column.cast(pa.list_(pa.float32()))
    values: list[Any] = column.to_pylist()
    if col.type == "numeric" and pa.types.is_floating(t):   # cost_rub: the shortest decimal of the float
        return [None if v is None else decimal.Decimal(repr(v)) for v in values]
    if col.type == "numeric" and pa.types.is_integer(t):    # an uint64
        return [None if v is None else decimal.Decimal(v) for v in values]
    if col.type == "jsonb":
        return [None if v is None else Jsonb(v, dumps=_dumps) for v in values]
    return values


def copy_rows(table: pa.Table, cols: Sequence[Column], dimensions: int) -> Iterator[tuple[Any, ...]]:
    """TABLE's rows in the order of COLS, as psycopg's Copy.write_row takes them."""
    found = []
    for col in cols:
        if col.name == TEXT:
            found.append(pc.fill_null(table.column(TEXT), "").to_pylist() if TEXT in table.column_names
                         else [""] * table.num_rows)
            continue
        column = table.column(col.name)
        found.append(vector_payloads(column, dimensions) if col.copy_type == "vector" else _values(column, col))
    return zip(*found, strict=True)


def select(table: pa.Table, rows: np.ndarray | Sequence[int] | None) -> pa.Table:
    """TABLE, or its ROWS (indexes) only."""
    return table if rows is None else table.take(pa.array(np.asarray(rows, dtype=np.int64)))

"""The kept columns' types across DIR's runs: a view holds one schema, whatever each day's input.

A run's input may give a kept column another Arrow type than the view holds. The rule:
- a type whose every value the view's type holds (int32 into an int64 view): written as the view's;
- a lossless widening (int8 -> ... -> int64, an unsigned into a wider signed, float16 -> float32
  -> float64, a wider decimal, s -> ms -> us, date32 -> date64, time units, list -> large_list, the
  same for the items of a list, the fields of a struct, a map's keys and values, null -> any):
  the view takes the join of both, and the commit casts its older rows to it (their vectors
  are kept as they are: nothing is paid);
- anything else (text and numbers, a float into an int, an int into a float, which loses digits
  past 2**53, a timestamp with and without a zone, a change to or from nanoseconds, which hold
  the years 1677-2262 only) is refused before anything is sent: the view would hold values its
  type cannot, or a reader of one glob would meet two types (pipeline/checks/prior.py says it).
The join is symmetric, so an input's own files are unified by the same rule.

The view's kept fields are in its manifest (`kept_types`); a view committed without them is
read from its files' footers, joined.
"""
from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from pipeline.outdir import layout
from transforms.read.parquet import open_parquet, parquet_file

if TYPE_CHECKING:
    from pipeline.outdir.view import View

KINDS = ("embeddings", "pending", "staged-embeddings")   # the files whose rows carry the kept columns
_UNITS = ("s", "ms", "us", "ns")
_DECIMAL128 = 38


class Mismatch(ValueError):
    """A kept column whose two types have no lossless join."""

    def __init__(self, name: str, was: pa.DataType, now: pa.DataType):
        super().__init__(f"{name}: {was} and {now}")
        self.name, self.was, self.now = name, was, now


def _integer(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    signed = [t for t in (a, b) if pa.types.is_signed_integer(t)]
    bits = max(a.bit_width, b.bit_width)
    if len(signed) != 1:   # both signed, or both unsigned
        return a if a.bit_width == bits else b
    unsigned = b if signed[0] is a else a
    need = max(signed[0].bit_width, 2 * unsigned.bit_width)
    return pa.from_numpy_dtype(f"int{need}") if need <= 64 else None


def _decimal(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    scale = max(a.scale, b.scale)
    precision = max(a.precision - a.scale, b.precision - b.scale) + scale
    wide = pa.types.is_decimal256(a) or pa.types.is_decimal256(b) or precision > _DECIMAL128
    if precision > 76:
        return None
    return pa.decimal256(precision, scale) if wide else pa.decimal128(precision, scale)


def _unit(a: str, b: str, to_ns: bool) -> str | None:
    """The finer unit; TO_NS: nanoseconds only where both are (their range is 1677-2262)."""
    if a != b and "ns" in (a, b) and not to_ns:
        return None
    return max(a, b, key=_UNITS.index)


def _binary(t: pa.DataType) -> bool:
    return bool(pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t) or
                pa.types.is_binary_view(t))


def _list_like(t: pa.DataType) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t))


def _field(a: pa.Field, b: pa.Field) -> pa.Field | None:
    """A's name, the join of both types, nullable when either is; None when they have no join."""
    joined = _join(a.type, b.type)
    return None if joined is None else pa.field(a.name, joined, a.nullable or b.nullable, a.metadata)


def _nested(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if _list_like(a) and _list_like(b):
        if (item := _field(a.value_field, b.value_field)) is None:
            return None
        if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b) and a.list_size == b.list_size:
            return pa.list_(item, a.list_size)
        return pa.large_list(item) if pa.types.is_large_list(a) or pa.types.is_large_list(b) else pa.list_(item)
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        fields = [_field(x, y) for x, y in zip(a, b, strict=True)] if [f.name for f in a] == [f.name for f in b] \
            else [None]
        return None if any(f is None for f in fields) else pa.struct(fields)
    if pa.types.is_map(a) and pa.types.is_map(b):
        key, item = _field(a.key_field, b.key_field), _field(a.item_field, b.item_field)
        return None if key is None or item is None else pa.map_(key, item, a.keys_sorted and b.keys_sorted)
    return None


def _join(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    if a == b:
        return a
    if pa.types.is_null(a) or pa.types.is_null(b):
        return b if pa.types.is_null(a) else a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        return _integer(a, b)
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if pa.types.is_decimal(a) and pa.types.is_decimal(b):
        return _decimal(a, b)
    if _binary(a) and _binary(b):
        return pa.large_binary() if pa.types.is_large_binary(a) or pa.types.is_large_binary(b) else pa.binary()
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        if (a.tz is None) != (b.tz is None) or (unit := _unit(a.unit, b.unit, False)) is None:
            return None
        return pa.timestamp(unit, a.tz if a.tz == b.tz else "UTC" if a.tz else None)   # an instant, whatever zone names it
    if pa.types.is_duration(a) and pa.types.is_duration(b):
        unit = _unit(a.unit, b.unit, False)
        return None if unit is None else pa.duration(unit)
    if pa.types.is_time(a) and pa.types.is_time(b):   # a day fits any unit
        unit = _unit(a.unit, b.unit, True)
        return pa.time64(unit) if unit in ("us", "ns") else pa.time32(unit)
    if pa.types.is_date(a) and pa.types.is_date(b):
        return pa.date64()
    return _nested(a, b)


def join(a: pa.DataType, b: pa.DataType, name: str) -> pa.DataType:
    """The type that holds every value of A and of B exactly; Mismatch (naming NAME) when none does."""
    joined = _join(a, b)
    if joined is None:
        raise Mismatch(name, a, b)
    return joined


def unify(view: Sequence[pa.Field], run: Sequence[pa.Field]) -> tuple[pa.Field, ...]:
    """The view's kept fields after a run whose input has RUN (the same names, in order)."""
    return tuple(pa.field(v.name, join(v.type, r.type, v.name), v.nullable or r.nullable, v.metadata)
                 for v, r in zip(view, run, strict=True))


def encode(fields: Sequence[pa.Field]) -> str:
    """FIELDS as the manifest keeps them: an Arrow schema, serialized."""
    return base64.b64encode(serialized(fields)).decode("ascii")


def decode(text: str) -> tuple[pa.Field, ...]:
    return tuple(pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text))))


def file_fields(path: str, names: Sequence[str]) -> tuple[pa.Field, ...]:
    """The fields NAMES of the Parquet file at PATH, from its footer."""
    with open_parquet(path) as fh:
        schema = parquet_file(fh).schema_arrow
    return tuple(schema.field(n) for n in names)


def view_fields(output_dir: str, view: View) -> tuple[pa.Field, ...]:
    """The kept fields of VIEW (pipeline/outdir/view.py): its manifest's, else the join of its files'."""
    if view.kept_types:
        return decode(view.kept_types)
    found: tuple[pa.Field, ...] | None = None
    for kind in KINDS:
        for path in view.paths(kind):
            fields = file_fields(layout.join(output_dir, path), view.kept)
            found = fields if found is None else unify(found, fields)
    return found if found is not None else tuple(pa.field(n, pa.null()) for n in view.kept)


def stale_files(output_dir: str, previous: View, fields: Sequence[pa.Field]) -> frozenset[str]:
    """The files of PREVIOUS (a view with FIELDS' kept columns; relative paths) whose kept
    columns are of other types than FIELDS: what a commit casts."""
    paths = [p for kind in KINDS for p in previous.paths(kind)]
    if previous.kept_types:   # one schema for all its files
        return frozenset() if decode(previous.kept_types) == tuple(fields) else frozenset(paths)
    return frozenset(p for p in paths if file_fields(layout.join(output_dir, p), previous.kept) != tuple(fields))


def serialized(fields: Sequence[pa.Field]) -> bytes:
    """FIELDS as a rewrite task carries them (transforms/write/rewrite.py: Task.cast_to)."""
    return bytes(pa.schema(list(fields)).serialize().to_pybytes())

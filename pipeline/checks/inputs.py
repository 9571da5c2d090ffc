"""Checks made before anything is sent: input files, columns and types, output directory.

Each failure is a UsageError with a message that says what to fix (exit code 2).
"""
from __future__ import annotations

import dataclasses
import urllib.parse
from collections.abc import Sequence
from typing import Any, NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.exits import UsageError
from pipeline.outdir.kept import Mismatch, unify
from transforms.read.parquet import normalised_type, open_parquet, parquet_file, read_tables
from transforms.read.stamps import Stamp, stamp


@dataclasses.dataclass(frozen=True)
class InputInfo:
    files: tuple[str, ...]
    rows: int
    kept_fields: tuple[pa.Field, ...]
    # partitions[i]: the hive partition values of files[i] ((key, value or None), ...); empty
    # when the input is not partitioned. ReadParquetTables takes them as they are.
    partitions: tuple[tuple[tuple[str, str | None], ...], ...] = ()
    columns: tuple[str, ...] = ()   # of pending rows, when they are the input (--resume alone)
    # stamps[i]: what files[i] was when listed, before anything read it; the job's workers and
    # the commit check it (empty: DIR's own pending files, which only a run holding the lock writes)
    stamps: tuple[Stamp, ...] = ()

    @property
    def partition_mappings(self) -> list[dict[str, Any]] | None:
        return [dict(p) for p in self.partitions] if self.partitions else None

    @property
    def stamp_map(self) -> dict[str, Stamp]:
        return dict(zip(self.files, self.stamps, strict=True)) if self.stamps else {}


GLOB_CHARS = "*?["
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # how Hive and Spark write a null partition value


def _stamp(path: str) -> Stamp:
    try:
        return stamp(path)
    except Exception as exc:
        raise UsageError(f"{path}: cannot read its size and modification time ({exc})") from None


def _read_schema(path: str) -> tuple[pa.Schema, int]:
    try:
        with open_parquet(path) as fh:
            meta = parquet_file(fh).metadata
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable Parquet file ({exc})") from None
    return meta.schema.to_arrow_schema(), meta.num_rows


def _list(pattern: str, what: str) -> list[str]:
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception as exc:  # FileSystems raises BeamIOError or scheme errors
        raise UsageError(f"--input {what}: cannot list files ({exc})") from None


def _root_of(pattern: str) -> str:
    """The directory part of PATTERN before its first glob character."""
    head = pattern[:min((i for i in (pattern.find(c) for c in GLOB_CHARS) if i >= 0), default=len(pattern))]
    return head[:head.rfind("/") + 1]


def _relative_parts(root: str, path: str) -> list[str]:
    return [p for p in path[len(root):].split("/") if p]


def _is_data_file(parts: list[str]) -> bool:
    """What pyarrow, Spark and Hive skip in a dataset: names starting with _ or . at any level
    below the root (_SUCCESS, _temporary/, .part-0.parquet.crc, _delta_log/)."""
    return not any(p.startswith(("_", ".")) for p in parts)


def _partition(parts: list[str], where: str) -> tuple[tuple[str, str | None], ...]:
    pairs = []
    for part in parts[:-1]:
        if "=" in part:
            key, value = part.split("=", 1)
            value = urllib.parse.unquote(value)
            pairs.append((urllib.parse.unquote(key), None if value == HIVE_NULL else value))
    if len({k for k, _ in pairs}) != len(pairs):
        raise UsageError(f"{where}: a partition key occurs twice in its path")
    return tuple(pairs)


def resolve_files(spec: str) -> tuple[list[str], list[tuple[tuple[str, str | None], ...]]]:
    """--input as a file, a glob, a directory or a hive-partitioned dataset: (the data files,
    the partition values of each). Works the same on local paths and object stores, where a
    directory is only a prefix."""
    if any(c in spec for c in GLOB_CHARS):
        root, found = _root_of(spec), _list(spec, spec)
    else:
        root = spec.rstrip("/") + "/"
        found = [p for p in _list(FileSystems.join(spec.rstrip("/"), "**"), spec) if p.startswith(root)]
        if not found:  # not a directory (or an empty one): the file itself
            return [p for p in _list(spec, spec) if p == spec][:1] or _no_files(spec), [()]
    files = [p for p in found if _is_data_file(_relative_parts(root, p))]
    if not files:
        _no_files(spec)
    partitions = [_partition(_relative_parts(root, p), p) for p in files]
    keys = {tuple(k for k, _ in p) for p in partitions}
    if len(keys) > 1:
        raise UsageError(f"--input {spec}: the files have different partition keys "
                         f"({' vs '.join('/'.join(k) or '(none)' for k in sorted(keys))})")
    return files, partitions


def _no_files(spec: str) -> NoReturn:
    raise UsageError(f"--input {spec}: no file matches (a Parquet file, a glob, or a directory of them)")


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(normalised_type(t)))


# A run carries kept values as Python objects: dates and times of the years 1 to 9999, to the
# microsecond. A kept column of dates, times or durations is read here, before anything is sent,
# for a value they do not hold (a worker would fail on it half way through the job).
_US = pa.timestamp("us")
_YEARS = (pa.scalar(-62135596800 * 10 ** 6, _US), pa.scalar(253402300800 * 10 ** 6 - 1, _US))   # 1-01-01, 9999-12-31


def _temporal(t: pa.DataType) -> bool:
    return bool(pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_time(t) or pa.types.is_duration(t))


def _python_holds(column: pa.ChunkedArray) -> str | None:
    """What of COLUMN's values Python's dates and times do not hold, or None."""
    t = column.type
    fine = {pa.types.is_timestamp: _US, pa.types.is_duration: pa.duration("us"), pa.types.is_time: pa.time64("us")}
    for check, target in fine.items():
        if check(t) and t.unit == "ns":
            try:
                column = column.cast(pa.timestamp("us", t.tz) if check is pa.types.is_timestamp else target)
            except pa.ArrowInvalid:
                return "a value finer than a microsecond"
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        try:
            found = pc.min_max(column.cast(_US))
        except pa.ArrowInvalid:   # beyond what microseconds count
            return "a date outside the years 1 to 9999"
        low, high = found["min"].value, found["max"].value
        if low is not None and (low < _YEARS[0].value or high > _YEARS[1].value):
            return "a date outside the years 1 to 9999"
    return None


def _check_times(path: str, fields: Sequence[pa.Field]) -> None:
    names = [f.name for f in fields if _temporal(f.type)]
    for name, column in zip(names, read_tables([path], names)[0].columns if names else (), strict=True):
        if (what := _python_holds(column)) is not None:
            raise UsageError(f"{path}: kept column {name} ({column.type}) holds {what}, which a run does not carry "
                             "(it carries dates and times of the years 1 to 9999, to the microsecond): give the "
                             "column a type that holds it in the input (a string, an integer), or leave it out of "
                             "--keep-columns")


def inspect_input(pattern: str, id_column: str, text_column: str, keep: Sequence[str]) -> InputInfo:
    files, partitions = resolve_files(pattern)
    stamps = tuple(_stamp(p) for p in files)
    keys = [k for k, _ in partitions[0]]
    rows, kept_fields = 0, None
    for path in files:
        schema, n = _read_schema(path)
        rows += n
        if clash := [k for k in keys if schema.get_field_index(k) >= 0 and k in (id_column, text_column, *keep)]:
            raise UsageError(f"{path}: column {clash[0]!r} is both in the file and a partition key of its path")
        for key in keys:
            schema = schema.append(pa.field(key, pa.string()))
        for column in (id_column, text_column, *keep):
            if schema.get_field_index(column) < 0:
                raise UsageError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)})")
        text_type = schema.field(text_column).type
        if not _is_text(text_type):
            raise UsageError(f"{path}: text column {text_column!r} is {text_type}, expected a string column")
        id_type = schema.field(id_column).type
        if not (_is_text(id_type) or pa.types.is_integer(normalised_type(id_type))):
            raise UsageError(f"{path}: id column {id_column!r} is {id_type}, expected string or integer")
        fields = tuple(schema.field(c).with_type(normalised_type(schema.field(c).type)) for c in keep)
        _check_times(path, [f for f in fields if f.name not in keys])
        try:   # the join of the files' types (pipeline/outdir/kept.py); required only if required in every file
            kept_fields = fields if kept_fields is None else unify(kept_fields, fields)
        except Mismatch as exc:
            raise UsageError(f"{path}: kept column {exc.name} is {exc.now} here and {exc.was} in {files[0]} or "
                             "another file listed before it: no type holds both exactly; write it with one type "
                             "in every file") from None
    return InputInfo(tuple(files), rows, kept_fields or (), tuple(partitions) if keys else (), stamps=stamps)

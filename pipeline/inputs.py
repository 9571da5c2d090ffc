"""Checks made before anything is sent: input files, columns and types, output directory.

Each failure is a UsageError with a message that says what to fix (exit code 2).
"""
from __future__ import annotations

import dataclasses
import uuid
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems


class UsageError(Exception):
    """A mistake in the command line or the input, found before spending (exit 2)."""


@dataclasses.dataclass(frozen=True)
class InputInfo:
    files: tuple[str, ...]
    rows: int
    kept_fields: tuple[pa.Field, ...]


def _read_schema(path: str) -> tuple[pa.Schema, int]:
    try:
        with FileSystems.open(path) as fh:
            meta = pq.ParquetFile(fh).metadata
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable Parquet file ({exc})") from None
    return meta.schema.to_arrow_schema(), meta.num_rows


def _value_type(t: pa.DataType) -> pa.DataType:
    """Dictionary-encoded columns (pandas 'category') hold values of their value type."""
    return t.value_type if pa.types.is_dictionary(t) else t


def inspect_input(pattern: str, id_column: str, text_column: str, keep: Sequence[str]) -> InputInfo:
    try:
        matches = FileSystems.match([pattern])[0].metadata_list
    except Exception as exc:  # FileSystems raises BeamIOError or scheme errors
        raise UsageError(f"--input {pattern}: cannot list files ({exc})") from None
    files = sorted(m.path for m in matches)
    if not files:
        raise UsageError(f"--input {pattern}: no file matches")
    rows, kept_fields = 0, None
    for path in files:
        schema, n = _read_schema(path)
        rows += n
        for column in (id_column, text_column, *keep):
            if schema.get_field_index(column) < 0:
                raise UsageError(f"{path}: no column {column!r} (columns: {', '.join(schema.names)})")
        text_type = _value_type(schema.field(text_column).type)
        if not (pa.types.is_string(text_type) or pa.types.is_large_string(text_type)):
            raise UsageError(f"{path}: text column {text_column!r} is {text_type}, expected a string column")
        id_type = _value_type(schema.field(id_column).type)
        if not (pa.types.is_string(id_type) or pa.types.is_large_string(id_type) or pa.types.is_integer(id_type)):
            raise UsageError(f"{path}: id column {id_column!r} is {id_type}, expected string or integer")
        fields = tuple(schema.field(c) for c in keep)
        if kept_fields is not None and [f.type for f in fields] != [f.type for f in kept_fields]:
            raise UsageError(f"{path}: kept columns have other types than in {files[0]}")
        # required in the outputs only if required in every input file
        kept_fields = fields if kept_fields is None else tuple(
            f.with_nullable(f.nullable or k.nullable) for f, k in zip(fields, kept_fields))
    return InputInfo(tuple(files), rows, kept_fields or ())


def check_output_writable(output_dir: str) -> None:
    probe = FileSystems.join(output_dir, f".write-probe-{uuid.uuid4().hex}")
    try:
        FileSystems.mkdirs(output_dir)
    except Exception:  # exists already: fine, the probe below decides
        pass
    try:
        with FileSystems.create(probe) as fh:
            fh.write(b"ok")
        FileSystems.delete([probe])
    except Exception as exc:
        raise UsageError(f"--output {output_dir}: not writable ({exc})") from None

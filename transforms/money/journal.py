"""The journal: every answered request, durable before the final outputs exist.

One small Parquet file per request under DIR/_journal/<run_id>/, written under a temporary
name and renamed, so a reader sees whole entries or none. A run killed mid-way loses nothing
it paid for: `--resume` reads these vectors instead of paying for the texts again.

Beside each entry, an intent (`<request_id>.intent.json`) is written before the request
leaves: an intent without an entry is a request a killed run may have been billed for whose
answer it never saw (pipeline/money/reconcile.py reconciles them against the balance).

On a local disk the entry's space is taken before the request leaves too (`reserve`: a file
`<request_id>.space` allocated to a bound of the entry's size), and the entry is written into
those blocks: a disk that fills while a request is out cannot lose its paid answer. A full
disk stops the run before it pays, never after.
"""
from __future__ import annotations

import datetime as dt
import errno
import io
import json
import os
import uuid
from collections.abc import Set
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from transforms.files import delete_each, remove_empty_dirs
from transforms.read.parquet import read_whole
from transforms.schemas import required

JOURNAL_DIR = "_journal"
INTENT_SUFFIX = ".intent.json"
SPACE_SUFFIX = ".space"
# An entry's size: its rows (vector bytes, a digest, two integers, with room) and the footer
# with the request's row (measured: 1.8 KB; 2048 x 1536 floats took 12,748,579 bytes).
ROW_BYTES, ENTRY_BYTES = 96, 8192

_SCHEMA_FIELDS = [required("text_sha256", pa.string()), required("n_tokens", pa.int32()),
                  required("share_micro", pa.int64())]


def journal_dir(output_dir: str, run_id: str | None = None) -> str:
    base = FileSystems.join(output_dir, JOURNAL_DIR)
    return FileSystems.join(base, run_id) if run_id else base


def write_entry(output_dir: str, run_id: str, request_row: dict[str, Any], shas: list[str], n_tokens: list[int],
                vectors: np.ndarray, shares_micro: list[int]) -> str:
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    row = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in request_row.items()}
    # A vector is one fixed-size binary value, its float32 bytes: Parquet writes a float list
    # with nesting levels per float, 3x the CPU on the hot path (measured). Short-lived,
    # so no compression, dictionary attempt or statistics either.
    vector_type = pa.binary(4 * rows.shape[1])
    schema = pa.schema([*_SCHEMA_FIELDS, required("embedding", vector_type)],
                       metadata={b"request": json.dumps(row).encode()})
    table = pa.Table.from_arrays([
        pa.array(shas, pa.string()), pa.array(n_tokens, pa.int32()), pa.array(shares_micro, pa.int64()),
        pa.FixedSizeBinaryArray.from_buffers(vector_type, len(rows), [None, pa.py_buffer(rows)]),
    ], schema=schema)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="none", use_dictionary=False, write_statistics=False)
    data = sink.getvalue()
    final = FileSystems.join(journal_dir(output_dir, run_id), f"{request_row['request_id']}.parquet")
    space = final[:-len(".parquet")] + SPACE_SUFFIX
    if _local(final) and os.path.exists(space):   # into the blocks reserved before the request left
        with open(space, "r+b") as fh:
            fh.write(data)
            fh.truncate()
        os.replace(space, final)
        return final
    temp = f"{final}.tmp-{uuid.uuid4().hex}"
    try:
        with FileSystems.create(temp) as fh:
            fh.write(data)
        FileSystems.rename([temp], [final])
    except BaseException:
        _remove(temp)
        raise
    return final


def entry_bytes(rows: int, dims: int) -> int:
    """A bound of the size of an entry of ROWS vectors of DIMS floats."""
    return rows * (4 * dims + ROW_BYTES) + ENTRY_BYTES


def reserve(output_dir: str, run_id: str, request_id: str, nbytes: int) -> None:
    """Take NBYTES of the disk for REQUEST_ID's entry before the request leaves (local disks:
    object stores do not fill up). A full disk raises here, with nothing sent."""
    path = FileSystems.join(journal_dir(output_dir, run_id), request_id + SPACE_SUFFIX)
    if not _local(path):
        return
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            os.posix_fallocate(fh.fileno(), 0, nbytes)
    except BaseException as exc:
        _remove(path)
        if isinstance(exc, OSError) and exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return   # a filesystem that cannot allocate ahead: the entry is written as it comes
        raise


def release(output_dir: str, run_id: str, request_ids: list[str]) -> None:
    """Give back what REQUEST_IDS reserved and did not fill: requests that got no entry."""
    for request_id in request_ids:
        path = FileSystems.join(journal_dir(output_dir, run_id), request_id + SPACE_SUFFIX)
        if _local(path) and os.path.exists(path):
            _remove(path)


def _local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def _remove(path: str) -> None:
    """Best effort: a partial file of a write that failed (one left: the next run's clean-up removes it)."""
    delete_each([path])


def entry_vectors(table: pa.Table) -> np.ndarray:
    """An entry's (rows, dims) float32 vectors: raw bytes per row, or a float list in entries
    written before that."""
    column = table.column("embedding").combine_chunks()
    if pa.types.is_fixed_size_binary(column.type):
        width = column.type.byte_width
        return np.frombuffer(column.buffers()[1], dtype="<f4", count=len(column) * width // 4,
                             offset=column.offset * width).reshape(len(column), width // 4)
    return np.asarray(column.flatten().to_numpy()).reshape(len(column), column.type.list_size)


def write_intent(output_dir: str, run_id: str, request_id: str, tokens: int, worst_case_micro: int) -> None:
    """Written straight to its name (no rename: an object store copies on rename, and this is
    on the path of every request); a torn intent still names its request."""
    intent = {"request_id": request_id, "run_id": run_id, "tokens": tokens, "worst_case_micro": worst_case_micro,
              "at": dt.datetime.now(dt.UTC).isoformat()}
    with FileSystems.create(FileSystems.join(journal_dir(output_dir, run_id), request_id + INTENT_SUFFIX)) as fh:
        fh.write(json.dumps(intent).encode())


def _named(pattern: str, suffix: str, skip: Set[str]) -> list[str]:
    """Paths matching PATTERN whose request id (the name before SUFFIX) is not in SKIP: a name
    is listed cheaply, a file is opened one request at a time."""
    paths = [m.path for m in FileSystems.match([pattern])[0].metadata_list]
    return [p for p in paths if FileSystems.split(p)[1][:-len(suffix)] not in skip]


def read_intents(output_dir: str, skip: Set[str] = frozenset()) -> list[dict[str, Any]]:
    """Every intent in OUTPUT_DIR's journal, but those of the request ids in SKIP."""
    intents = []
    for path in _named(FileSystems.join(journal_dir(output_dir), "*", "*" + INTENT_SUFFIX), INTENT_SUFFIX, skip):
        folder, name = FileSystems.split(path)
        try:
            with FileSystems.open(path) as fh:
                intents.append(json.loads(fh.read()))
        except ValueError:  # torn by a kill: the request is known, its size is not
            intents.append({"request_id": name[:-len(INTENT_SUFFIX)], "run_id": FileSystems.split(folder)[1],
                            "tokens": None, "worst_case_micro": None, "at": None})
    return intents


def read_path(path: str, columns: list[str] | None = None) -> tuple[dict[str, Any], pa.Table]:
    """(request row, table of sha/n_tokens/share_micro/embedding, or COLUMNS) of the entry at PATH."""
    with FileSystems.open(path) as fh:
        table = read_whole(io.BytesIO(fh.read()), columns)
    return json.loads(table.schema.metadata[b"request"]), table


def read_entry(output_dir: str, run_id: str,
               request_id: str) -> tuple[dict[str, Any], list[str], list[int], np.ndarray] | None:
    """This run's entry for REQUEST_ID, if an earlier attempt of the bundle already paid for it:
    (request row, text_sha256 of each input, its share_micro, the vectors)."""
    path = FileSystems.join(journal_dir(output_dir, run_id), f"{request_id}.parquet")
    if not FileSystems.exists(path):
        return None
    row, table = read_path(path)
    return (row, table.column("text_sha256").to_pylist(), table.column("share_micro").to_pylist(),
            entry_vectors(table))


def read_requests(output_dir: str, skip: Set[str] = frozenset()) -> list[dict[str, Any]]:
    """The request row of every whole entry but those in SKIP, from the file's footer alone."""
    rows = []
    for path in _named(FileSystems.join(journal_dir(output_dir), "*", "*.parquet"), ".parquet", skip):
        with FileSystems.open(path) as fh:
            rows.append(json.loads(pq.read_schema(fh).metadata[b"request"]))
    return rows


def discard(output_dir: str, run_id: str) -> None:
    """The run's final files and summary exist: its journal is no longer needed."""
    directory, base = journal_dir(output_dir, run_id), journal_dir(output_dir)
    entries = [m.path for m in FileSystems.match([FileSystems.join(directory, "*")])[0].metadata_list]
    if entries:  # object stores have no directories: delete the objects themselves
        FileSystems.delete(entries)
    remove_empty_dirs((directory, base))


def vector_dims(vector_type: pa.DataType) -> int:
    """Floats per vector: a fixed-size binary of float32 bytes, or (earlier entries) a float list."""
    return int(vector_type.byte_width // 4 if pa.types.is_fixed_size_binary(vector_type) else vector_type.list_size)


def unwritten(output_dir: str, written_requests: set[str], model: str,
              dims: int) -> tuple[list[str], list[dict[str, Any]]]:
    """The journal entries in OUTPUT_DIR for MODEL at DIMS: (their paths, the request rows that
    no requests file has yet). Footers only: the vectors are read where they are used, by the
    job (transforms/dedupe/known.py), never gathered in the driver."""
    paths, request_rows = [], []
    for path in _named(FileSystems.join(journal_dir(output_dir), "*", "*.parquet"), ".parquet", set()):
        with FileSystems.open(path) as fh:
            schema = pq.read_schema(fh)
        request = json.loads(schema.metadata[b"request"])
        if request["model"] != model or vector_dims(schema.field("embedding").type) != dims:
            continue  # another model's vectors are never another model's answer
        paths.append(path)
        if request["request_id"] not in written_requests:
            request_rows.append(request)
    return paths, request_rows

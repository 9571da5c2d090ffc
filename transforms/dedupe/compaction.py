"""Compaction of a store of paid texts (transforms/dedupe/store.py): its journal entries, one
small file per paid request, merged into one file per model and length under `_compacted/`, with
the columns reuse reads. Safe beside pipelines that write and read the store: the merged file is
written under a temporary name and renamed whole before anything it holds is deleted, and a
reader that finds a file gone lists the store again. A CLI output DIR is refused, whole: its
journal is the CLI's (a killed run's answers and intents, read by --resume and the
reconciliation), and the CLI never reads `_compacted/`. No Beam step here."""
from __future__ import annotations

import uuid
from typing import BinaryIO, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from transforms.dedupe.store import COMPACTED, StoreError, cli_output_dir, listing, plain
from transforms.files import delete_each, missing, remove_empty_dirs
from transforms.money import journal
from transforms.read.parquet import open_parquet, parquet_file
from transforms.schemas import required

ROWS_PER_GROUP = 1024     # a compacted file's row group: what one vector read fetches (~6 MB at 1536)
SMALL_BYTES = 64 << 20    # configs/pipeline.yaml store.compact_below_mb: compacted files under it are merged again


class Compaction(NamedTuple):
    entries: int      # journal entries merged
    files: int        # compacted files merged
    written: int      # compacted files written
    texts: int        # distinct texts in them


def _compacted_schema(dims: int) -> pa.Schema:
    return pa.schema([required("text_sha256", pa.string()), required("model", pa.string()),
                      pa.field("request_id", pa.string()), required("n_tokens", pa.int32()),
                      required("embedding", pa.list_(pa.float32(), dims))])


def _entry_table(path: str) -> tuple[str, int, pa.Table]:
    """(model, dims, compacted-schema table) of one journal entry."""
    request, table = journal.read_path(path)
    vectors = journal.entry_vectors(table)
    n, dims = vectors.shape
    return request["model"], dims, pa.Table.from_arrays([
        table.column("text_sha256"), pa.array([request["model"]] * n, pa.string()),
        pa.array([request["request_id"]] * n, pa.string()), table.column("n_tokens"),
        pa.FixedSizeListArray.from_arrays(pa.array(vectors.reshape(-1), pa.float32()), dims)],
        schema=_compacted_schema(dims))


def _compacted_tables(path: str):
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        dims = parquet.schema_arrow.field("embedding").type.list_size
        for g in range(parquet.metadata.num_row_groups):
            table = parquet.read_row_group(g).cast(_compacted_schema(dims))
            for model in set(table.column("model").to_pylist()):
                yield model, dims, table.filter(pc.equal(table.column("model"), model))


class _Writers:
    """One compacted file per (model, dims), written under a temporary name, renamed when whole."""

    def __init__(self, store: str):
        self._store, self.texts = store, 0
        self._open: dict[tuple[str, int], tuple[str, str, BinaryIO, pq.ParquetWriter]] = {}   # temp, final name
        self.seen: dict[tuple[str, int], set[str]] = {}

    def write(self, model: str, dims: int, table: pa.Table) -> None:
        seen = self.seen.setdefault((model, dims), set())
        shas = table.column("text_sha256").to_pylist()
        keep = []
        for i, sha in enumerate(shas):
            if sha not in seen:
                seen.add(sha)
                keep.append(i)
        if not keep:
            return
        if (model, dims) not in self._open:
            final = FileSystems.join(self._store, COMPACTED, f"{uuid.uuid4().hex}.parquet")
            temp = f"{final}.tmp-{uuid.uuid4().hex}"
            fh = FileSystems.create(temp)
            self._open[(model, dims)] = (temp, final, fh, pq.ParquetWriter(fh, _compacted_schema(dims)))
        self._open[(model, dims)][3].write_table(table.take(keep), row_group_size=ROWS_PER_GROUP)
        self.texts += len(keep)

    def close(self) -> int:
        for temp, final, fh, writer in self._open.values():
            writer.close()
            fh.close()
            FileSystems.rename([temp], [final])
        return len(self._open)


def compact(store: str, small_bytes: int = SMALL_BYTES) -> Compaction:
    """Merge STORE's journal entries (and its compacted files under SMALL_BYTES) into one file
    per model and length. Safe beside running pipelines: the new file is whole (renamed) before
    anything it holds is deleted, an entry written meanwhile is not touched, and a reader that
    finds a file gone lists the store again. Intents of merged entries go with them. A CLI
    output DIR: a StoreError, nothing touched."""
    if cli_output_dir(plain(store, "path")):
        raise StoreError(f"{store} is an output DIR of the CLI, not a store of paid texts: its journal is the "
                         "CLI's to read (run --resume), so it is not compacted; nothing was changed")
    files = [m for r in FileSystems.match([FileSystems.join(store, COMPACTED, "*.parquet")]) for m in r.metadata_list]
    small = sorted(m.path for m in files if m.size_in_bytes < small_bytes)
    entries = listing(store)[1]
    if not entries and len(small) <= 1:   # nothing to merge
        return Compaction(0, 0, 0, 0)
    writers, merged, merged_files = _Writers(store), [], []
    for path in small:
        try:
            for model, dims, table in _compacted_tables(path):
                writers.write(model, dims, table)
        except Exception as exc:
            if not missing(exc):
                raise
            continue
        merged_files.append(path)
    for path in entries:
        try:
            writers.write(*_entry_table(path))
        except Exception as exc:
            if not missing(exc):
                raise
            continue
        merged.append(path)
    written = writers.close()
    left = delete_each(merged_files + merged + [p[:-len(".parquet")] + journal.INTENT_SUFFIX for p in merged])
    remove_empty_dirs({FileSystems.split(p)[0] for p in merged})
    if left:
        failed, why = left[0]
        raise StoreError(f"{store}: compacted (the texts are read from {COMPACTED}/), but {len(left)} of the files "
                         f"merged could not be removed ({failed}: {why}): compact again once they can be")
    return Compaction(len(merged), len(merged_files), written, writers.texts)

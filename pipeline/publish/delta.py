"""What a delta writes: the rows of DIR's view that the table does not hold as they are, and
the keys it holds that the view no longer has (key columns only: no vector is read here).

A row is known by its key (doc_id, chunk_index, token_start) and its identity: the run that
wrote it, its text's sha256 and the request that paid its vector. A view's files never change
once written, and a row a commit carries into a new file keeps all three; a row a run wrote
again carries that run's id. So between the view the table serves (its manifest is kept in
`_views/` for `views.keep` views) and DIR's current view, only files in one of them are read:
- rows of the new view's own files whose (key, identity) the old view's own files lack: written;
- keys of the old view's own files that the new view's lack: deleted.
Removals are thus what the job's commits removed, never what a run did not see. When the
served view's manifest is no longer kept, the table's own rows stand for the old side (their
keys and identities, read from the server: the checksums vouch for the rest of them).
Rows of buckets whose checksum differs from the record (edited by hand) are all rewritten.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.outdir import OutputDir, layout
from pipeline.outdir.jsonfiles import read_json
from pipeline.outdir.view import View
from transforms.publish.columns import KEY, bucket_of
from transforms.publish.load import Task
from transforms.read.parquet import open_parquet, parquet_file

IDENTITY = ("run_id", "text_sha256", "request_id")
ROWS = pa.schema([("doc_id", pa.string()), ("chunk_index", pa.int32()), ("token_start", pa.int32()),
                  *((c, pa.string()) for c in IDENTITY),
                  ("file", pa.int32()), ("group", pa.int32()), ("row", pa.int32())])


def _keys(columns: pa.Table, file: int = -1, group_sizes: list[int] | None = None) -> pa.Table:
    """COLUMNS (KEY and IDENTITY) as ROWS, placed in FILE by its row groups' sizes."""
    n = columns.num_rows
    sizes = group_sizes if group_sizes is not None else [n]
    groups = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    rows = np.arange(n, dtype=np.int32) - np.repeat(np.cumsum([0, *sizes[:-1]], dtype=np.int32), sizes)
    return pa.table([*(columns.column(c).cast(ROWS.field(c).type) for c in (*KEY, *IDENTITY)),
                     pa.array(np.full(n, file, np.int32)), pa.array(groups), pa.array(rows)], schema=ROWS)


def read_keys(paths: list[str]) -> pa.Table:
    """The key, identity and place (file number in PATHS, row group, row) of every row."""
    tables = []
    for f, path in enumerate(paths):
        with open_parquet(path) as fh:
            parquet = parquet_file(fh)
            sizes = [parquet.metadata.row_group(g).num_rows for g in range(parquet.metadata.num_row_groups)]
            tables.append(_keys(parquet.read(columns=[*KEY, *IDENTITY]), f, sizes))
    return pa.concat_tables(tables) if tables else ROWS.empty_table()


def table_keys(batches) -> pa.Table:
    """The same from the table's own rows, in BATCHES of (doc_id, chunk_index, token_start,
    *IDENTITY) tuples."""
    names = [*KEY, *IDENTITY]
    tables = [_keys(pa.table(dict(zip(names, map(list, zip(*rows, strict=True)), strict=True)))) for rows in batches]
    return pa.concat_tables(tables) if tables else ROWS.empty_table()


def served_view(out: OutputDir, view_id: str) -> View | None:
    """The view the table serves, while DIR keeps its manifest."""
    doc = read_json(out.join(layout.view_manifest(view_id)))
    return View.from_json(doc) if doc else None


@dataclasses.dataclass(frozen=True)
class Delta:
    tasks: list[Task]         # rows to write, by row group
    gone: pa.Table            # keys to delete (KEY columns)
    writes: int

    @property
    def rows(self) -> int:
        """Rows it changes in the table: writes and deletes (a bucket's deletes come on top)."""
        return self.writes + len(self.gone)


def _in_buckets(keys: pa.Table, buckets: set[int]) -> pa.Array:
    if not buckets or not keys.num_rows:
        return pa.array(np.zeros(keys.num_rows, bool))
    columns = (keys.column(c).to_pylist() for c in KEY)
    return pa.array([bucket_of(*k) in buckets for k in zip(*columns, strict=True)], pa.bool_())


def diff(old: pa.Table, new: pa.Table, all_new: pa.Table | None, drifted: list[int]) -> tuple[pa.Table, pa.Table]:
    """(rows of NEW to write, keys of OLD to delete). ALL_NEW: every row of the view, when
    DRIFTED buckets are rewritten whole."""
    writes = new.join(old, keys=[*KEY, *IDENTITY], join_type="left anti")
    gone = old.join(new, keys=list(KEY), join_type="left anti")
    if drifted:
        if all_new is None:
            raise ValueError("drifted buckets are written again from every row of the view: ALL_NEW is due")
        buckets = set(drifted)
        writes = writes.filter(pc.invert(_in_buckets(writes, buckets)))
        gone = gone.filter(pc.invert(_in_buckets(gone, buckets)))
        writes = pa.concat_tables([writes, all_new.filter(_in_buckets(all_new, buckets))])
    return writes, gone.select(list(KEY))


def tasks_of(writes: pa.Table, paths: list[str]) -> list[Task]:
    """A task per row group that has rows to write, with their indexes."""
    if not writes.num_rows:
        return []
    writes = writes.sort_by([("file", "ascending"), ("group", "ascending"), ("row", "ascending")])
    files, groups = writes.column("file").to_numpy(), writes.column("group").to_numpy()
    rows = writes.column("row").to_numpy().astype(np.int32)
    starts = np.flatnonzero(np.r_[True, (files[1:] != files[:-1]) | (groups[1:] != groups[:-1])])
    ends = np.r_[starts[1:], len(files)]
    return [Task(paths[files[s]], int(groups[s]), rows[s:e].tobytes(), n)
            for n, (s, e) in enumerate(zip(starts, ends, strict=True))]


def plan(out: OutputDir, view: View, served: View | None, table_rows, drifted: list[int]) -> Delta:
    """The delta from SERVED (None: its manifest is gone; TABLE_ROWS() then gives the table's
    keys and identities, in batches) to VIEW."""
    current = view.paths("embeddings")
    if served is not None:
        before = set(served.paths("embeddings"))
        own_new = [p for p in current if p not in before]
        own_old = sorted(before - set(current))
        old = read_keys([out.join(p) for p in own_old])
    else:
        own_new, old = current, table_keys(table_rows())
    paths = [out.join(p) for p in own_new]
    new = read_keys(paths)
    all_new = None
    if drifted:   # every row of the view, placed in the files of the view
        paths = [out.join(p) for p in current]
        all_new = read_keys(paths)
        new = all_new.filter(pc.is_in(all_new.column("file"), value_set=pa.array(
            [current.index(p) for p in own_new], pa.int32())))
    writes, gone = diff(old, new, all_new, drifted)
    return Delta(tasks_of(writes, paths), gone, writes.num_rows)

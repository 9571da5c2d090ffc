"""Rewrite: the files of a view whose rows change, split by document (no Beam but the last class).

A commit (pipeline/outdir/commit.py) decides, per document, which rows leave DIR's current
view (an edited or removed document's old version, the pending rows a run re-decided) and
which move (a new version staged until complete, or promoted once it is). A file none of
whose rows leave or move stays as it is; the others are read a row group at a time and
written again: the rows that stay to one file, the rows that move to another. A file whose
kept columns the view has widened since it was written is written again the same way, cast.
A file of rows without their text, in a view whose other files have it, is written with a
null `text` (PAD_TEXT): one schema in the view, so that every engine reads its files as one table.
"""
from __future__ import annotations

import concurrent.futures as cf
from typing import NamedTuple
from collections.abc import Sequence

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from transforms.read.parquet import open_parquet, parquet_file, read_whole
from transforms.schemas import TEXT
from transforms.write.transform import Codec, open_writer

_NO_IDS = pa.array([], pa.string())


class Rules(NamedTuple):
    """Rows of the documents DROP_DOCS leave, rows whose chunk_key() is in DROP_KEYS leave,
    rows of MOVE_DOCS move; with DROP_NULL_IDS, rows without a doc_id leave."""
    drop_docs: pa.Array = _NO_IDS
    drop_keys: pa.Array = _NO_IDS
    move_docs: pa.Array = _NO_IDS
    drop_null_ids: bool = False

    @property
    def empty(self) -> bool:
        return not (len(self.drop_docs) or len(self.drop_keys) or len(self.move_docs) or self.drop_null_ids)

    def key_columns(self, names: Sequence[str]) -> list[str]:
        return ["doc_id"] + (["chunk_index"] if len(self.drop_keys) and "chunk_index" in names else [])


def chunk_keys(doc_ids, chunk_indexes):
    """One string per (doc_id, chunk_index): the key of a chunk's rows in DROP_KEYS."""
    return pc.binary_join_element_wise(doc_ids, pc.cast(chunk_indexes, pa.string()), "\x00")


def masks(keys: pa.Table, rules: Rules) -> tuple[pa.Array, pa.Array]:
    """(rows that leave, rows that move) of a table holding the rules' key columns."""
    doc = keys.column("doc_id")
    drop = pc.is_in(doc, value_set=rules.drop_docs)
    if len(rules.drop_keys) and "chunk_index" in keys.column_names:
        drop = pc.or_(drop, pc.is_in(chunk_keys(doc, keys.column("chunk_index")), value_set=rules.drop_keys))
    if rules.drop_null_ids:
        drop = pc.or_(drop, pc.is_null(doc))
    drop = pc.fill_null(drop, False)
    move = pc.and_(pc.fill_null(pc.is_in(doc, value_set=rules.move_docs), False), pc.invert(drop))
    return drop, move


def count(path: str, rules: Rules) -> tuple[int, int, int]:
    """(rows, rows that leave, rows that move) of the file at PATH, from its key columns."""
    rows = dropped = moved = 0
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        columns = rules.key_columns(parquet.schema_arrow.names)
        for g in range(parquet.metadata.num_row_groups):
            drop, move = masks(parquet.read_row_group(g, columns=columns), rules)
            rows += len(drop)
            dropped += pc.sum(drop).as_py() or 0
            moved += pc.sum(move).as_py() or 0
    return rows, dropped, moved


class Task(NamedTuple):
    source: str
    rules: str               # the name of its rules among the commit's
    stays_to: str | None     # None: no row stays
    moves_to: str | None     # None: no row moves
    cast_to: bytes | None = None   # the kept columns' fields the rows take (a serialized schema), if others
    pad_text: bool = False   # the source has no text column: written with a null one


def cast_columns(table: pa.Table, fields: pa.Schema) -> pa.Table:
    """TABLE with the columns FIELDS names cast to their fields (a view's widened kept columns:
    pipeline/outdir/kept.py), its own metadata kept."""
    schema = pa.schema([fields.field(f.name) if f.name in fields.names else f for f in table.schema],
                       metadata=table.schema.metadata)
    return table.cast(schema)


def with_null_text(table: pa.Table) -> pa.Table:
    """TABLE with a null `text` beside its `text_sha256`, where rows that carry it have it."""
    at = table.schema.get_field_index("text_sha256") + 1
    return table.add_column(at, pa.field(TEXT, pa.string()), pa.nulls(table.num_rows, pa.string()))


def _row_groups(parquet: pq.ParquetFile):
    """Each row group, the next one read while the caller writes this one (pyarrow lets go of
    the GIL in both: a third less wall time for a file of vectors)."""
    with cf.ThreadPoolExecutor(1, thread_name_prefix="read-ahead") as ahead:
        n = parquet.metadata.num_row_groups
        coming = ahead.submit(parquet.read_row_group, 0) if n else None
        for g in range(n):
            assert coming is not None   # submitted for every group below n
            group = coming.result()
            coming = ahead.submit(parquet.read_row_group, g + 1) if g + 1 < n else None
            yield group


def split_file(task: Task, rules: Rules, codec: Codec) -> None:
    """Write the rows of TASK.source that stay and those that move, a row group at a time (cast
    to TASK.cast_to's fields, if any)."""
    writers = {}
    cast_to = pa.ipc.read_schema(pa.py_buffer(task.cast_to)) if task.cast_to else None
    with open_parquet(task.source) as fh:
        parquet = parquet_file(fh)
        columns = rules.key_columns(parquet.schema_arrow.names)
        try:
            for group in _row_groups(parquet):
                group = cast_columns(group, cast_to) if cast_to is not None else group
                drop, move = masks(group.select(columns), rules)
                group = with_null_text(group) if task.pad_text else group
                stay = pc.invert(pc.or_(drop, move))
                for path, mask in ((task.stays_to, stay), (task.moves_to, move)):
                    if path is not None and pc.any(mask).as_py():
                        if path not in writers:
                            sink = FileSystems.create(path)
                            writers[path] = (open_writer(sink, group.schema, codec), sink)
                        writers[path][0].write_table(group.filter(mask))
        finally:
            for writer, sink in writers.values():
                writer.close()
                sink.close()


_ARRAYS = ("drop_docs", "drop_keys", "move_docs")


def save_rules(path: str, rules: dict[str, Rules]) -> None:
    """RULES (name -> Rules) as one small Parquet file: the workers read it, so that a job's
    graph does not carry every changed id (Dataflow limits a graph's size)."""
    rows = [(name, field, value) for name, r in rules.items() for field in _ARRAYS
            for value in getattr(r, field).to_pylist()]
    rows += [(name, "drop_null_ids", None) for name, r in rules.items() if r.drop_null_ids]
    rows += [(name, "named", None) for name in rules]
    table = pa.table({k: [r[i] for r in rows] for i, k in enumerate(("rules", "field", "value"))},
                     schema=pa.schema([("rules", pa.string()), ("field", pa.string()), ("value", pa.string())]))
    with FileSystems.create(path) as sink:
        pq.write_table(table, sink, compression="zstd")


def load_rules(path: str) -> dict[str, Rules]:
    with open_parquet(path) as fh:
        table = read_whole(fh)
    found: dict[str, dict] = {}
    for name, field, value in zip(*(table.column(c).to_pylist() for c in ("rules", "field", "value")), strict=True):
        fields = found.setdefault(name, {f: [] for f in _ARRAYS})
        if field in _ARRAYS:
            fields[field].append(value)
        elif field == "drop_null_ids":
            fields["drop_null_ids"] = True
    return {name: Rules._make([*(pa.array(f[a], pa.string()) for a in _ARRAYS), f.get("drop_null_ids", False)])
            for name, f in found.items()}


class _SplitFiles(beam.DoFn):
    def __init__(self, rules_path: str, codec: Codec):
        self._rules_path, self._codec = rules_path, codec

    def setup(self):
        self._rules = load_rules(self._rules_path)

    def process(self, task: Task):
        split_file(task, self._rules[task.rules], self._codec)


class RewriteFiles(beam.PTransform):
    """Tasks -> the files they write (nothing comes out); RULES_PATH: save_rules' file."""

    def __init__(self, rules_path: str, codec: Codec):
        super().__init__()
        self._fn = _SplitFiles(rules_path, codec)

    def expand(self, tasks):
        return tasks | "Spread" >> beam.Reshuffle() | "Split" >> beam.ParDo(self._fn)

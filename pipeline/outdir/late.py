"""After a streaming job: the rows whose text had already been sent when they arrived (late
duplicates, transforms/dedupe/distinct.py) get a copy of what became of the text's first row:
its vector and request id at cost 0, its pending text, or its failure.

Only this run's files are read, a row group at a time, and only the first rows' chunks are
kept, so memory follows the number of late rows, not the corpus.
"""
from __future__ import annotations

import collections
import uuid
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.outdir import OutputDir
from transforms.dedupe.distinct import LateRef
from transforms.read.parquet import matching_rows
from transforms.write.transform import Codec, open_writer

KINDS = ("embeddings", "pending", "failed")


def _keys(table: pa.Table) -> pa.Array:
    index = pc.cast(table.column("chunk_index"), pa.string())
    return pc.binary_join_element_wise(table.column("doc_id"), pc.fill_null(index, ""), "\x00")


def _copies(rows: pa.Table, late_by_first: dict[str, list[LateRef]], kept: Sequence[str],
            seen: set[tuple[Any, ...]]) -> pa.Table:
    """One row per late ref of each row in ROWS, re-addressed to the late row. A chunk may hold
    rows of several texts (pieces an earlier run left pending, resumed one by one): a late ref
    takes only the rows inside its first row's token span, the pieces of that text. Failed rows
    have no span: a late row takes each distinct failure once (SEEN, across calls)."""
    spans = "token_start" in rows.column_names
    if spans:
        starts = rows.column("token_start").to_pylist()
    else:
        outcomes = list(zip(rows.column("reason").to_pylist(), rows.column("detail").to_pylist(), strict=True))
    take, lates = [], []
    for i, key in enumerate(_keys(rows).to_pylist()):
        for late in late_by_first[key]:
            if spans and not late.first[2] <= starts[i] < late.first[3]:
                continue   # a row of another text of the same chunk
            if not spans:
                outcome = (late.ref.doc_id, late.ref.chunk_index, *outcomes[i])
                if outcome in seen:
                    continue
                seen.add(outcome)
            take.append(i)
            lates.append(late)
    out = rows.take(pa.array(take, pa.int64()))
    values = {"doc_id": [late.ref.doc_id for late in lates],
              "chunk_index": [late.ref.chunk_index for late in lates]}
    if spans:  # embeddings and pending rows: a span of the late row's doc
        shift = [late.ref.token_start - late.first[2] for late in lates]
        values.update(chunk_count=[late.ref.chunk_count for late in lates],
                      token_start=[s + d for s, d in zip(out.column("token_start").to_pylist(), shift, strict=True)],
                      token_end=[e + d for e, d in zip(out.column("token_end").to_pylist(), shift, strict=True)],
                      **{name: [late.ref.kept[j] for late in lates] for j, name in enumerate(kept)})
    if "cost_rub" in out.column_names:  # the first row carries the cost, as for a reused vector
        values["cost_rub"] = [0.0] * len(lates)
    for name, column in values.items():
        i = out.schema.get_field_index(name)
        out = out.set_column(i, out.schema.field(i), pa.array(column, out.schema.field(i).type))
    return out


def write_late_copies(out: OutputDir, run_id: str, late: Sequence[LateRef], kept: Sequence[str],
                      codec: Codec) -> int:
    """Write the late rows' copies beside this run's files; returns the number of rows written."""
    if not late:
        return 0
    late_by_first = collections.defaultdict(list)
    for ref in late:
        late_by_first[f"{ref.first[0]}\x00{ref.first[1]}"].append(ref)
    wanted = pa.array(list(late_by_first), pa.string())

    def wanted_rows(keys: pa.Table) -> pa.Array:
        return pc.is_in(_keys(keys), value_set=wanted)

    written = 0
    for kind in KINDS:
        seen: set[tuple[Any, ...]] = set()
        writer, path = None, FileSystems.join(out.run_dir(run_id), f"{kind}-{run_id}-late-00000-of-00001.parquet")
        for source in out.history_files(kind, run_id):
            for rows in matching_rows(source, ["doc_id", "chunk_index"], wanted_rows):
                copies = _copies(rows, late_by_first, kept, seen)
                if writer is None:
                    sink = FileSystems.create(temp := f"{path}.tmp-{uuid.uuid4().hex}")
                    writer = open_writer(sink, rows.schema, codec)
                writer.write_table(copies)
                written += copies.num_rows
        if writer is not None:
            writer.close()
            sink.close()
            FileSystems.rename([temp], [path])   # whole or absent: every later run reads the history
    return written

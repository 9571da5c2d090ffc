"""Documents PostgreSQL cannot hold: a NUL character (U+0000) in a document's id, its text or
a kept string. Parquet and the run hold them, `publish` refuses them (transforms/publish/
values.py); `plan` and `run` say so before anything is paid, so that one fix of the input
serves, not one a refused publish.

The columns are read a row group at a time, and a NUL is looked for in their bytes (a few ms
for 100 MB); only a row group that has one is read row by row.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import pyarrow as pa

from pipeline.checks.inputs import InputInfo
from transforms.publish import values
from transforms.read.parquet import normalise, open_parquet, parquet_file

log = logging.getLogger("embedpipe")


def nul_documents(info: InputInfo, id_column: str, columns: Sequence[str]) -> list[str]:
    """The ids of the documents of INFO's files whose ID_COLUMN or COLUMNS hold a NUL, each
    once, in the order read. A file that cannot be read is left to the run to name."""
    found: dict[str, None] = {}
    for path in info.files:
        try:
            with open_parquet(path) as fh:
                pf = parquet_file(fh)
                names = [c for c in dict.fromkeys([id_column, *columns]) if c in pf.schema_arrow.names]
                if id_column not in names:   # a hive key: the path's value
                    continue
                for g in range(pf.metadata.num_row_groups):
                    table, rows = pf.read_row_group(g, columns=names), set()
                    for name in names:
                        column = normalise(table.column(name)).combine_chunks()
                        if values.holds_nul(column):
                            rows.update(values.rows_with(column, values.NUL))
                    if rows:
                        ids = normalise(table.column(id_column)).combine_chunks().cast(pa.string())
                        taken = ids.take(pa.array(sorted(rows), pa.int64())).to_pylist()
                        found.update(dict.fromkeys(i for i in taken if i is not None))
        except (pa.ArrowException, OSError, ValueError):
            continue
    return list(found)


def warn_nul(info: InputInfo, id_column: str, text_column: str, text: bool) -> None:
    """One line when documents hold a NUL where the published table would (TEXT: the rows carry
    their text, so it is published)."""
    kept = [f.name for f in info.kept_fields]
    docs = nul_documents(info, id_column, [*([text_column] if text else []), *kept])
    if docs:
        log.warning("the input has a NUL character (U+0000) in the id, the text or a kept column of %s; the run "
                    "embeds them, but PostgreSQL's text holds no NUL, so `publish` will refuse them: remove the "
                    "NULs from the input (a run with --sync then embeds the edited documents again)",
                    values.shown(docs))

"""Loading a task's rows into a table of the database by binary COPY (no Beam here: the
workers' LoadRows in transforms/publish/transform.py runs it, and the launcher runs it itself
for a delta of a few rows).

A task is a row group of a view's file, all its rows or some. It is loaded in one transaction
that first records it in the load's markers (transforms/publish/sql.py): a task a runner
retries, or runs twice at once, is loaded once, and the launcher counts the markers to know
that every task was. Only the row groups the tasks name are read. The URL holds no password
(libpq finds it where it runs: PGPASSWORD, PGPASSFILE, ~/.pgpass).
"""
from __future__ import annotations

import re
from typing import NamedTuple

import numpy as np
import psycopg
from psycopg import errors
from psycopg.adapt import Dumper
from psycopg.pq import Format

from transforms.errors import one_line
from transforms.publish import sql
from transforms.publish.columns import Column
from transforms.publish.rows import copy_rows, select
from transforms.read.parquet import open_parquet, parquet_file


class Task(NamedTuple):
    path: str                 # a file of the view (absolute, any Beam filesystem)
    group: int                # its row group
    rows: bytes | None        # int32 indexes of the rows wanted in that row group; None: all
    number: int               # the task's marker in its load


class Load(NamedTuple):
    """Where a load's rows go: the table, its columns, and how to reach the database."""
    url: str                  # libpq URL without a password
    schema: str
    table: str
    columns: tuple[Column, ...]
    dimensions: int
    vector_oid: int           # the vector type's oid in that database
    connect_timeout_s: float

    @property
    def copy_types(self) -> list[int | str]:
        return [self.vector_oid if c.copy_type == "vector" else c.copy_type for c in self.columns]


def _vector_dumper(oid: int) -> type[Dumper]:
    """A dumper of rows' vectors already in pgvector's binary form (transforms/publish/rows.py)."""
    return type("VectorPayload", (Dumper,), {"format": Format.BINARY, "oid": oid, "dump": lambda self, obj: obj})


def connect(url: str, timeout_s: float, role: str) -> psycopg.Connection:
    """Autocommit: every transaction is an explicit `with conn.transaction()`."""
    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(timeout_s)),
                           application_name=f"embedpipe {role}")


def loader(load: Load, role: str) -> psycopg.Connection:
    """A connection that loads LOAD's rows (vectors go as they are, by the type's oid)."""
    conn = connect(load.url, load.connect_timeout_s, role)
    conn.adapters.register_dumper(None, _vector_dumper(load.vector_oid))   # by oid only
    return conn


def load_task(conn: psycopg.Connection, load: Load, task: Task) -> int:
    """TASK's rows into LOAD's table, once: the rows written (0 when another attempt did)."""
    with open_parquet(task.path) as fh:
        parquet = parquet_file(fh)
        group = parquet.read_row_group(task.group, columns=[c.name for c in load.columns
                                                            if c.name in parquet.schema_arrow.names])
    rows = None if task.rows is None else np.frombuffer(task.rows, dtype=np.int32)
    table = select(group, rows)
    with conn.transaction():
        if not sql.mark_loaded(conn, load.schema, load.table, task.number, table.num_rows):
            return 0
        with conn.cursor().copy(sql.copy_in(load.schema, load.table, [c.name for c in load.columns])) as copy:
            copy.set_types(load.copy_types)
            for row in copy_rows(table, load.columns, load.dimensions):
                copy.write_row(row)
    return int(table.num_rows)


class LoadFailed(RuntimeError):
    """A database error on a worker, carried to the launcher by its SQLSTATE (load_failed): a
    runner hands a worker's exception over as text, and database_error() makes it the same
    psycopg class again, so the launcher tells a full disk or a missing right from the rest as
    it does its own."""


def load_failed(exc: psycopg.Error) -> LoadFailed:
    state = f" [SQLSTATE {exc.sqlstate}]" if exc.sqlstate else ""
    return LoadFailed(f"{type(exc).__name__}{state}: {one_line(exc)}")


_CARRIED = re.compile(r" \[SQLSTATE ([0-9A-Z]{5})\]: (.*)")


def database_error(failure: Exception) -> psycopg.Error | None:
    """The database error a worker's LoadFailed carries in FAILURE (a failed job's), as its
    psycopg class; None when FAILURE is not one."""
    found = _CARRIED.search(one_line(failure, worker=True))
    try:
        return errors.lookup(found[1])(found[2]) if found else None
    except KeyError:   # a state this psycopg does not know
        return None

"""LoadRows: tasks (a row group of a view's file, all its rows or some) -> rows in a table of
the database, by binary COPY, on the pipeline's workers.

Each worker opens its own connection in setup() from a URL that holds no password (libpq
finds it on the worker: PGPASSWORD, PGPASSFILE, ~/.pgpass). A task is loaded in one
transaction that first records it in the load's markers (transforms/publish/sql.py): a task
a runner retries, or runs twice at once, is loaded once, and the launcher counts the markers
to know that every task was. Tasks are small records; the rows are read on the worker, only
the row groups the tasks name, and go to the database from there.
"""
from __future__ import annotations

from typing import NamedTuple

import apache_beam as beam
import numpy as np
import psycopg
from psycopg.adapt import Dumper
from psycopg.pq import Format

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
    connect_timeout_s: float = 10.0

    @property
    def copy_types(self) -> list:
        return [self.vector_oid if c.copy_type == "vector" else c.copy_type for c in self.columns]


def _vector_dumper(oid: int) -> type[Dumper]:
    """A dumper of rows' vectors already in pgvector's binary form (transforms/publish/rows.py)."""
    return type("VectorPayload", (Dumper,), {"format": Format.BINARY, "oid": oid, "dump": lambda self, obj: obj})


def connect(url: str, timeout_s: float, role: str) -> psycopg.Connection:
    """Autocommit: every transaction is an explicit `with conn.transaction()`."""
    return psycopg.connect(url, autocommit=True, connect_timeout=max(1, round(timeout_s)),
                           application_name=f"embedpipe {role}")


def load_task(conn: psycopg.Connection, load: Load, task: Task) -> int:
    """TASK's rows into LOAD's table, once: the rows written (0 when another attempt did)."""
    with open_parquet(task.path) as fh:
        group = parquet_file(fh).read_row_group(task.group, columns=[c.name for c in load.columns])
    rows = None if task.rows is None else np.frombuffer(task.rows, dtype=np.int32)
    table = select(group, rows)
    with conn.transaction():
        if not sql.mark_loaded(conn, load.schema, load.table, task.number, table.num_rows):
            return 0
        with conn.cursor().copy(sql.copy_in(load.schema, load.table, [c.name for c in load.columns])) as copy:
            copy.set_types(load.copy_types)
            for row in copy_rows(table, load.columns, load.dimensions):
                copy.write_row(row)
    return table.num_rows


class _LoadFn(beam.DoFn):
    def __init__(self, load: Load):
        self._load = load
        self._rows = beam.metrics.Metrics.counter("embedpipe", "published_rows")

    def setup(self):
        self._conn = connect(self._load.url, self._load.connect_timeout_s, "publish worker")
        self._conn.adapters.register_dumper(None, _vector_dumper(self._load.vector_oid))   # by oid only

    def process(self, task: Task):
        try:
            self._rows.inc(load_task(self._conn, self._load, task))
        except psycopg.Error as exc:   # its first line: the rest is the statement and a caret
            raise RuntimeError(f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0]}") from None

    def teardown(self):
        if getattr(self, "_conn", None) is not None:
            self._conn.close()


class LoadRows(beam.PTransform):
    """Tasks -> their rows in LOAD's table (nothing comes out)."""

    def __init__(self, load: Load):
        super().__init__()
        self._load = load

    def expand(self, tasks):
        return tasks | "Spread" >> beam.Reshuffle() | "Copy" >> beam.ParDo(_LoadFn(self._load))

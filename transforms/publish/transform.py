"""LoadRows: tasks (a row group of a view's file, all its rows or some) -> rows in a table of
the database, by binary COPY (transforms/publish/load.py), on the pipeline's workers.

Each worker opens its own connection in setup(). Tasks are small records; the rows are read
on the worker and go to the database from there.
"""
from __future__ import annotations

import apache_beam as beam
import psycopg

from transforms.publish.load import Load, Task, load_failed, load_task, loader


class _LoadFn(beam.DoFn):
    def __init__(self, load: Load):
        self._load = load
        self._rows = beam.metrics.Metrics.counter("embedpipe", "published_rows")

    def setup(self):
        self._conn = loader(self._load, "publish worker")

    def process(self, task: Task):
        try:
            self._rows.inc(load_task(self._conn, self._load, task))
        except psycopg.Error as exc:
            raise load_failed(exc) from None

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

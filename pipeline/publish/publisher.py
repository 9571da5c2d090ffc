"""publish(DIR's view -> NAME): the launcher's part.

    checks (checks.py) -> lock NAME (one publisher) -> its record -> the tables a killed
    publish left, dropped
      -> nothing to do                    the record names this view, the checksums agree and
                                          NAME is defined as a publish defines it
      -> a delta (pipeline/publish/delta.py) staged by the workers, applied in one transaction
      -> a build: the model's table beside the served one, loaded by the workers, indexed as
         its length allows (index.py), then, once the transactions older than its rows have
         ended (snapshots.py), swapped in (pipeline/publish/database.py: swap)

The workers (transforms/publish/transform.py: LoadRows) read the view's files and COPY the
rows; the launcher reads manifests, footers and key columns only, so its memory does not grow
with the vectors. A delta of at most publish.launcher_rows rows is loaded by the launcher
itself, one row group at a time (a pipeline takes longer to start than they take to load). A publish killed at any point leaves NAME serving what it served: nothing it
did is visible before the delta's commit or the swap's.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import itertools
import logging
import shlex
import time

import apache_beam as beam
import numpy as np
import psycopg
import pyarrow as pa
from psycopg import errors

from pipeline.exits import JobFailed, UsageError
from pipeline.outdir import OutputDir
from pipeline.outdir.kept import Mismatch, view_fields
from pipeline.outdir.view import View, rows_without_text
from pipeline.publish import checks, definition
from pipeline.publish import database as dbs
from pipeline.publish import delta as deltas
from pipeline.publish.database import DATA, STAGING, Record
from pipeline.publish.dependents import check_dependents
from pipeline.publish.failure import failure
from pipeline.publish.index import Index, build_indexes
from pipeline.publish.names import Names
from pipeline.publish.snapshots import wait_for_older_snapshots
from pipeline.publish.embedded import reach
from pipeline.publish.target import EMBEDDED, Database, TableName, check_target, embedded_data
from pipeline.runner import make_runner
from pipeline.settings.config import PublishSettings
from transforms.errors import one_line
from transforms.publish.columns import BUCKETS, KEY_BYTES, Column, Unpublishable, columns
from transforms.publish import values
from transforms.publish.load import Load, Task, database_error, load_task, loader
from transforms.publish.rows import select
from transforms.publish.transform import LoadRows
from transforms.read.parquet import open_parquet, parquet_file

log = logging.getLogger("embedpipe")

def kept_fields(out: OutputDir, view: View) -> list[pa.Field]:
    """The kept columns' fields: the view's, one type each for all its files (pipeline/outdir/kept.py)."""
    try:
        return list(view_fields(out.path, view))
    except Mismatch as exc:   # a view committed before its types were one
        raise Unpublishable(f"kept column {exc.name} is {exc.was} in some files of the view and {exc.now} in "
                            "others, which no one type holds exactly") from None


def all_tasks(out: OutputDir, view: View) -> list[Task]:
    """A task per row group of the view's embeddings files (their footers tell how many)."""
    tasks: list[Task] = []
    for path in view.paths("embeddings"):
        full = out.join(path)
        with open_parquet(full) as fh:
            groups = parquet_file(fh).metadata.num_row_groups
        tasks += [Task(full, g, None, len(tasks) + g) for g in range(groups)]
    return tasks


def check_values(tasks: list[Task], cols: list[Column]) -> int:
    """Every value TASKS would write fits its column (transforms/publish/values.py): the columns
    that may hold one that does not, read before anything is written; Unpublishable if not.
    The bytes of their longest document id."""
    names, longest, found = values.scanned(cols), 0, values.Faults()
    for path, group in itertools.groupby(tasks, key=lambda t: t.path):
        with open_parquet(path) as fh:
            parquet = parquet_file(fh)
            read = [n for n in dict.fromkeys(["doc_id", *names]) if n in parquet.schema_arrow.names]
            for task in group:
                table = select(parquet.read_row_group(task.group, columns=read),
                               None if task.rows is None else np.frombuffer(task.rows, dtype=np.int32))
                values.faults(table, cols, found)
                longest = max(longest, values.longest_id(table))
    if (refusal := values.refusal(found, cols)) is not None:
        raise Unpublishable(refusal)
    return longest


def load_here(tasks: list[Task], load: Load) -> None:
    """TASKS' rows into LOAD's table from the launcher, over a connection of its own (a few
    rows: a pipeline would take longer to start than they take to load)."""
    with loader(load, "publish loader") as conn:
        for task in tasks:
            try:
                load_task(conn, load, task)
            except (OSError, pa.ArrowException) as exc:
                raise JobFailed(f"could not read {task.path} to load it into {load.schema}.{load.table}: "
                                f"{one_line(exc)}; the table serves what it did before: publish again") from None


def run_load(tasks: list[Task], load: Load, opts) -> None:
    """The workers' job: TASKS' rows into LOAD's table."""
    if not tasks:
        return
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    _ = pipeline | "Tasks" >> beam.Create(tasks) | "Load" >> LoadRows(load)
    try:
        pipeline.run().wait_until_finish()
    except Exception as exc:   # a worker's error arrives wrapped by the runner
        if (error := database_error(exc)) is not None:
            raise error from None   # told as the launcher's own (_failure)
        raise JobFailed(f"a worker could not load rows into {load.schema}.{load.table}: {one_line(exc, worker=True)}; "
                        "the table serves what it did before: publish again") from None


@dataclasses.dataclass
class Context:
    out: OutputDir
    view: View
    db: Database
    conn: psycopg.Connection
    names: Names
    cols: list[Column]
    index: Index
    settings: PublishSettings
    opts: object
    text_search: str = "simple"   # text_tsv's configuration, as the server names it
    embedded: bool = False        # --to embedded
    long_ids: bool = False   # the data table keys on the ids' md5 (transforms/publish/columns.py: KEY_BYTES)

    def load(self, table: str) -> Load:
        return Load(self.db.url, self.names.schema, table, tuple(self.cols), self.view.dimensions,
                    dbs.vector_oid(self.conn), self.settings.connect_timeout_s)

    def record(self, data_table: str, rows: int, counts, hashes) -> Record:
        v = self.view
        details = {"dir": self.out.path, "published_at": dt.datetime.now(dt.UTC).isoformat(),
                   "pending": v.rows("pending"), "failed": v.rows("failed"),
                   "staged": v.rows("staged-embeddings"), "view_committed_at": v.committed_at,
                   **({"key": "md5(doc_id)"} if self.long_ids else {})}
        return Record(data_table, v.view, v.model, v.dimensions, tuple((c.name, c.type) for c in self.cols), rows,
                      tuple(counts), tuple(hashes), index=self.index.signature, text_search=self.text_search,
                      details=details)

    def loaded_all(self, table: str, tasks: list[Task], rows: int) -> None:
        n, found = dbs.loaded(self.conn, self.names, table)
        if (n, found) != (len(tasks), rows):
            raise JobFailed(f"the workers loaded {found:,} rows in {n} of {len(tasks)} tasks where {rows:,} were "
                            f"due; {self.names.qualified} serves what it did: publish again")


def compatible(record: Record | None, ctx: Context) -> bool:
    """Whether the served table takes this view's rows as they are (same model, length, columns,
    the index this publish would build, text_tsv's configuration)."""
    return (record is not None and record.model == ctx.view.model and record.dimensions == ctx.view.dimensions
            and record.columns == tuple((c.name, c.type) for c in ctx.cols)
            and record.index == ctx.index.signature and record.text_search == ctx.text_search)


def build(ctx: Context, record: Record | None) -> dict:
    """The view's rows in a new table beside the served one, indexed, then swapped in."""
    names, view = ctx.names, ctx.view
    served = definition.definition(ctx.conn, names.schema, names.name)
    change = "it is not there" if served is None else served.change_to(
        definition.expected(ctx.conn, names, ctx.cols, None))
    check_dependents(ctx.conn, names, record, change is None, change or "")
    tasks, rows = all_tasks(ctx.out, view), view.rows("embeddings")
    longest = check_values(tasks, ctx.cols)
    ctx.long_ids = longest > KEY_BYTES
    if not dbs.case_maps(ctx.conn):
        data = shlex.quote(str(embedded_data(ctx.out.path)))
        log.warning("the database at %s lower-cases ASCII letters only (the C locale's character type): its text "
                    "search tells Данные from данные; %s", ctx.db.shown,
                    f"a database made by this version does not: `mv {data} {data}-old`, then publish again"
                    if ctx.embedded else "a database of a Unicode locale does not (CREATE DATABASE ... "
                    "LOCALE_PROVIDER builtin BUILTIN_LOCALE 'C.UTF-8' TEMPLATE template0, PostgreSQL 17 or later)")
    log.info("%s: %s", names.qualified, ctx.index.describe(view.model))
    table = names.new(DATA)
    dbs.create_data_table(ctx.conn, names, table, ctx.cols,
                          f"embedpipe: rows of {names.qualified} (view {view.view}, {view.model})",
                          ctx.settings.fillfactor, ctx.text_search)
    started = time.monotonic()
    run_load(tasks, ctx.load(table), ctx.opts)
    ctx.loaded_all(table, tasks, rows)
    loaded_at = time.monotonic()
    build_indexes(ctx.conn, names, table, ctx.index, rows, ctx.settings, longest)
    indexed_at = time.monotonic()
    counts, hashes = dbs.aggregates(ctx.conn, names, table)
    waited = wait_for_older_snapshots(ctx.conn, names, ctx.settings)
    attempts = dbs.swap(ctx.conn, names, table, ctx.cols, change is None, ctx.record(table, rows, counts, hashes),
                        ctx.settings)
    if record is not None and record.data_table != table:
        dbs.drop_table(ctx.conn, names, record.data_table, ctx.settings, attempts=3)
    return {"action": "built" if record is None else "rebuilt", "inserted": rows, "updated": 0,
            "deleted": record.rows if record else 0, "swap_attempts": attempts,
            "index": ctx.index.describe(view.model),
            "seconds": {"load": round(loaded_at - started, 3), "index": round(indexed_at - loaded_at, 3),
                        "snapshots_waited": waited}}


def _publish(ctx: Context) -> dict:
    record = dbs.load_record(ctx.conn, ctx.names)
    checks.check_ours(ctx.conn, ctx.names, record)
    keep = [record.data_table] if record else []
    dropped = dbs.remove_leftovers(ctx.conn, ctx.names, keep, ctx.settings)
    if (record is None or not compatible(record, ctx)
            or dbs.relkind(ctx.conn, ctx.names.schema, record.data_table) is None):
        result = build(ctx, record)
    else:
        result = update(ctx, record)
    result["leftovers_dropped"] = dropped
    return result


def _redefine(ctx: Context, record: Record) -> bool | None:
    """How NAME is defined again over the served table: None when it is as a publish defines
    it, True by CREATE OR REPLACE, False made anew (refused first when objects of the user's
    depend on it)."""
    names = ctx.names
    served = definition.definition(ctx.conn, names.schema, names.name)
    if served is None:
        return False
    want = definition.expected(ctx.conn, names, ctx.cols, record.data_table)
    if served == want:
        return None
    log.warning("%s is defined otherwise than a publish defines it (by hand?): it is defined again", names.qualified)
    change = served.change_to(want)
    if change is not None:
        check_dependents(ctx.conn, names, None, False, change)
    return change is None


def update(ctx: Context, record: Record) -> dict:
    """The served table brought to the view: nothing, a delta, or (when the delta is a large
    share of the rows) a build."""
    names, view = ctx.names, ctx.view
    sums = dbs.Checksums(*dbs.aggregates(ctx.conn, names, record.data_table))
    drifted = [b for b in range(BUCKETS) if (sums.counts[b], sums.hashes[b]) != (record.counts[b], record.hashes[b])]
    if drifted:
        log.warning("%s differs from what was published in %d of %d buckets (edited by hand?): their rows are "
                    "written again", names.qualified, len(drifted), BUCKETS)
    redefine = _redefine(ctx, record)
    if record.view == view.view and not drifted and redefine is None:
        return {"action": "unchanged", "inserted": 0, "updated": 0, "deleted": 0}
    started = time.monotonic()
    delta = deltas.plan(ctx.out, view, deltas.served_view(ctx.out, record.view),
                        lambda: dbs.table_rows(ctx.conn, names, record.data_table), drifted)
    if delta.rows > ctx.settings.rebuild_share * max(view.rows("embeddings"), 1):
        log.info("%s: %d of %d rows change, more than publish.rebuild_share: built beside and swapped in",
                 names.qualified, delta.rows, view.rows("embeddings"))
        return build(ctx, record)
    ctx.long_ids = record.details.get("key") == "md5(doc_id)"
    if (longest := check_values(delta.tasks, ctx.cols)) > KEY_BYTES and not ctx.long_ids:
        log.info("%s: a document id of %d bytes is longer than the index on ids holds: built beside and swapped in, "
                 "keyed on the ids' md5", names.qualified, longest)
        return build(ctx, record)
    staging, loaded_by = None, None
    if delta.tasks:
        staging = names.new(STAGING)
        dbs.create_staging(ctx.conn, names, staging, ctx.cols)
        if delta.writes <= ctx.settings.launcher_rows:
            load_here(delta.tasks, ctx.load(staging))
            loaded_by = "launcher"
        else:
            run_load(delta.tasks, ctx.load(staging), ctx.opts)
            loaded_by = "workers"
        ctx.loaded_all(staging, delta.tasks, delta.writes)
    loaded_at = time.monotonic()
    rows = view.rows("embeddings")
    try:
        inserted, updated, deleted = dbs.apply_delta(
            ctx.conn, names, record, staging, ctx.cols, delta.gone, drifted, sums,
            lambda s: ctx.record(record.data_table, rows, s.counts, s.hashes), redefine)
    except dbs.Inexact as exc:   # never served: the whole view instead
        if staging is not None:
            dbs.drop_table(ctx.conn, names, staging, ctx.settings, attempts=1)
        log.warning("%s: the delta was not exact (%s): built beside and swapped in", names.qualified, exc)
        return build(ctx, record)
    except psycopg.Error:   # rolled back (a constraint of the user's, say): its rows staged go too, if they can
        if staging is not None and not ctx.conn.broken:
            with contextlib.suppress(psycopg.Error):
                dbs.drop_table(ctx.conn, names, staging, ctx.settings, attempts=1)
        raise
    written = inserted + updated + deleted
    return {"action": "delta" if written or redefine is None else "redefined", "inserted": inserted,
            "updated": updated, "deleted": deleted, "drifted_buckets": len(drifted), "loaded_by": loaded_by,
            "seconds": {"load": round(loaded_at - started, 3), "apply": round(time.monotonic() - loaded_at, 3)}}


def publish(out: OutputDir, target: str, table: TableName, settings: PublishSettings, opts) -> dict:
    """Make TABLE at TARGET serve OUT's current view; the report."""
    check_target(target, out.path)
    view = out.view
    if view is None:
        raise UsageError(f"{out.path} has no view to publish: run `python -m pipeline run ... --output {out.path}` "
                         "first")
    started = time.monotonic()
    try:
        cols = columns(kept_fields(out, view), view.dimensions)
    except Unpublishable as exc:
        raise UsageError(f"{exc}: a run with --sync and --keep-columns without it makes every row again at no cost, "
                         "and a view that publishes (nothing was written)") from None
    index = Index(view.dimensions)
    with reach(target, out.path, create=True, settings=settings) as db:
        conn = dbs.connect(db, settings)
        names = None
        try:
            names, text_search = checks.resolve(conn, db, table.schema, table.name, index,
                                                settings.text_search_config, settings.lock_wait_s)
            ctx = Context(out, view, db, conn, names, cols, index, settings, opts, text_search, target == EMBEDDED)
            with dbs.publisher_lock(conn, names, settings.lock_wait_s):
                result = _publish(ctx)
            dbs.search_default(conn, settings.ef_search)
        except Unpublishable as exc:   # a value, found before anything was written
            name = names.qualified if names else table.name
            raise UsageError(f"publishing to {name} refused: {exc}; change it in the input and run again with "
                             f"--sync (no row was written: {name} serves what it did)") from None
        except errors.ForeignKeyViolation as exc:   # a delta's deletes, rolled back: the user's constraint is in the way
            raise UsageError(f"publishing to {names.qualified if names else table.name} failed: {one_line(exc)}: a "
                             "foreign key of yours refers to rows the view no longer has; drop it, or delete the "
                             "rows that refer to them, then publish again (nothing was changed)") from None
        except psycopg.Error as exc:
            raise JobFailed(failure(exc, db, names.qualified if names else table.name)) from None
        finally:
            conn.close()
    return {"table": names.qualified, "target": db.shown, "view": view.view, "model": view.model,
            "dimensions": view.dimensions, "rows": view.rows("embeddings"), **result,
            "written": result["inserted"] + result["updated"] + result["deleted"],
            "pending": view.rows("pending"), "failed": view.rows("failed"), "staged": view.rows("staged-embeddings"),
            "without_text": rows_without_text(out.path, view), "text_search": text_search,
            "seconds_total": round(time.monotonic() - started, 3)}

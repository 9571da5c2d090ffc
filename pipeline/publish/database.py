"""The launcher's statements: checks, the lock, the record of what NAME serves, the tables
beside it, the index build, the delta's one transaction and the swap.

What lives in NAME's schema:
- NAME: a view over the model's data table `embedpipe_data_<key>_<token>` (<key>: 8 hex of
  NAME, so that a publish finds its own tables and never another NAME's);
- `embedpipe_published`: one row per NAME, the record (the view of DIR served, model,
  dimensions, columns, rows, the per-bucket checksum of transforms/publish/columns.py);
- `embedpipe_staging_<key>_<token>`: a delta's rows before they are applied (unlogged);
- `embedpipe_loads`: the workers' markers (transforms/publish/sql.py).
Tables named like NAME's but not served (a killed publish's) are dropped by the next one.
Every identifier is quoted (psycopg.sql); NAME is checked to be one before it gets here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import secrets
import time
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import errors, sql

from pipeline.exits import JobFailed, UsageError
from pipeline.publish.target import Database
from pipeline.settings.config import PublishSettings
from transforms.errors import one_line
from transforms.publish.columns import (BUCKET, BUCKETS, HASH, KEY, KEY_BYTES, Column, bucket_sql, hash_sql,
                                        index_expression, key_index)
from transforms.publish.sql import LOADS, create_loads, ident, one
from transforms.publish.load import connect as open_connection

log = logging.getLogger("embedpipe")

META = "embedpipe_published"
DATA, STAGING = "embedpipe_data_", "embedpipe_staging_"
FORMAT = 1
KEYS_BATCH = 50_000   # rows of keys a fetch brings to the launcher (a few MB)


def connect(db: Database, settings: PublishSettings) -> psycopg.Connection:
    try:
        return open_connection(db.url, settings.connect_timeout_s, "publish")
    except psycopg.OperationalError as exc:
        raise JobFailed(f"the database at {db.shown} did not answer: {one_line(exc)}") from None


@dataclasses.dataclass(frozen=True)
class Names:
    """NAME and the names of the tables beside it, in its schema."""
    schema: str
    name: str

    @property
    def key(self) -> str:
        return hashlib.sha256(f"{self.schema}.{self.name}".encode()).hexdigest()[:8]

    @property
    def qualified(self) -> str:
        return f"{self.schema}.{self.name}"

    def new(self, prefix: str) -> str:
        return f"{prefix}{self.key}_{secrets.token_hex(4)}"

    def __call__(self, table: str | None = None) -> sql.Composed:
        return ident(self.schema, table or self.name)


def schema_of(conn: psycopg.Connection, db: Database, schema: str | None) -> str:
    """SCHEMA, or the search_path's first when not given, checked to exist."""
    if schema is None:
        schema = one(conn.execute("SELECT current_schema()"))[0]
        if schema is None:
            raise UsageError(f"no schema of the search_path exists in {db.shown}: give --table SCHEMA.TABLE")
    elif conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        raise UsageError(f"schema {schema} does not exist in {db.shown}")
    return schema


def resolve(conn: psycopg.Connection, db: Database, schema: str | None, name: str, wait_s: float) -> Names:
    """NAME's schema (schema_of), checked to take tables from this role; pgvector there, and the
    tables beside NAME that it shares (waiting at most WAIT_S for another publish making them)."""
    schema = schema_of(conn, db, schema)
    role, may_create = one(conn.execute("SELECT current_user, has_schema_privilege(%s, 'CREATE')", (schema,)))
    if not may_create:
        raise JobFailed(f"role {role} may not create tables in schema {schema} of {db.shown}: grant it CREATE "
                        "there, or publish as a role that has it")
    shared_tables(conn, db, schema, wait_s)
    return Names(schema, name)


def shared_tables(conn: psycopg.Connection, db: Database, schema: str, wait_s: float) -> None:
    """pgvector in the database, and the tables every NAME of SCHEMA shares (the markers, the
    records), made once: under an advisory lock of the database, since two publishes making
    them at once (of two NAMEs: each holds only its own NAME's lock) would race on the
    catalogue's unique indexes (IF NOT EXISTS looks before it inserts)."""
    with lock_timeout(conn, wait_s), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("shared tables"),))
        _vector(conn, db)
        conn.execute(create_loads(schema))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, record jsonb NOT NULL, "
                             "bucket_counts integer[] NOT NULL, bucket_hashes bigint[] NOT NULL)").format(
            ident(schema, META)))


def _vector(conn: psycopg.Connection, db: Database) -> None:
    if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone():
        return
    if conn.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'vector'").fetchone() is None:
        raise JobFailed(f"pgvector is not installed on the server of {db.shown}: install it there "
                        "(https://github.com/pgvector/pgvector#installation), or publish --to embedded")
    try:
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
    except errors.InsufficientPrivilege:
        raise JobFailed(f"pgvector is installed on the server of {db.shown} but not enabled in its database, and "
                        "this role may not enable it: ask its owner to run CREATE EXTENSION vector") from None


def vector_oid(conn: psycopg.Connection) -> int:
    return int(one(conn.execute("SELECT 'vector'::regtype::oid"))[0])


def advisory_key(what: str) -> int:
    """The bigint key of an advisory lock on WHAT (advisory locks are the database's own)."""
    return int.from_bytes(hashlib.sha256(f"embedpipe {what}".encode()).digest()[:8], "big", signed=True)


@contextlib.contextmanager
def lock_timeout(conn: psycopg.Connection, wait_s: float) -> Iterator[None]:
    """The statements of the block wait at most WAIT_S for a lock (LockNotAvailable after it)."""
    conn.execute(sql.SQL("SET lock_timeout = {}").format(sql.Literal(f"{max(1, round(wait_s * 1000))}ms")))
    try:
        yield
    finally:
        conn.execute("RESET lock_timeout")


@contextlib.contextmanager
def publisher_lock(conn: psycopg.Connection, names: Names, wait_s: float) -> Iterator[None]:
    """One publisher per NAME: a session advisory lock (released with the connection, so a
    killed publish holds nothing), waited for at most WAIT_S by the server, then refused."""
    key = advisory_key(f"publish {names.qualified}")
    try:
        with lock_timeout(conn, wait_s):
            conn.execute("SELECT pg_advisory_lock(%s)", (key,))
    except errors.LockNotAvailable:
        holder = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                              "AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
                              ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF))
        pid = (holder.fetchone() or ("?",))[0]
        raise JobFailed(f"another publish of {names.qualified} is under way (server process {pid}); "
                        "run this one again once it has ended") from None
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))


@dataclasses.dataclass(frozen=True)
class Record:
    """What NAME serves, as the publish that made it recorded it."""
    data_table: str
    view: str
    model: str
    dimensions: int
    columns: tuple[tuple[str, str], ...]    # (name, type) of the data table, in order
    rows: int
    counts: tuple[int, ...]                 # per bucket: rows
    hashes: tuple[int, ...]                 # per bucket: the xor of their row hashes
    details: dict = dataclasses.field(default_factory=dict)   # shown, never compared


def load_record(conn: psycopg.Connection, names: Names) -> Record | None:
    row = conn.execute(sql.SQL("SELECT record, bucket_counts, bucket_hashes FROM {} WHERE name = %s")
                       .format(names(META)), (names.name,)).fetchone()
    if row is None:
        return None
    doc, counts, hashes = row
    return Record(doc["data_table"], doc["view"], doc["model"], doc["dimensions"],
                  tuple(tuple(c) for c in doc["columns"]), doc["rows"], tuple(counts), tuple(hashes), doc)


def save_record(conn: psycopg.Connection, names: Names, record: Record) -> None:
    doc = {**record.details, "format": FORMAT, "data_table": record.data_table, "view": record.view,
           "model": record.model, "dimensions": record.dimensions, "columns": [list(c) for c in record.columns],
           "rows": record.rows}
    conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                         "record = EXCLUDED.record, bucket_counts = EXCLUDED.bucket_counts, "
                         "bucket_hashes = EXCLUDED.bucket_hashes").format(names(META)),
                 (names.name, json.dumps(doc), list(record.counts), list(record.hashes)))


def relkind(conn: psycopg.Connection, schema: str, name: str) -> str | None:
    row = conn.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
    return row[0] if row else None


def reads_from(conn: psycopg.Connection, names: Names, data_table: str) -> bool:
    """Whether NAME is a view over DATA_TABLE (as a publish made it)."""
    row = conn.execute("SELECT 1 FROM pg_rewrite r JOIN pg_depend d ON d.objid = r.oid AND d.classid = "
                       "'pg_rewrite'::regclass WHERE r.ev_class = to_regclass(%s) AND d.refobjid = to_regclass(%s)",
                       (regclass(names.schema, names.name), regclass(names.schema, data_table))).fetchone()
    return row is not None


def regclass(schema: str, name: str) -> str:
    """SCHEMA.NAME as to_regclass() takes it: quoted."""
    return sql.Identifier(schema, name).as_string(None)


def check_ours(conn: psycopg.Connection, names: Names, record: Record | None) -> None:
    """NAME is free, or a view this publish made: anything else is the user's, never touched."""
    kind = relkind(conn, names.schema, names.name)
    if kind is None:
        return
    if record is None or kind != "v" or not reads_from(conn, names, record.data_table):
        raise UsageError(f"{names.qualified} exists and is not a table embedpipe publishes: give another --table, "
                         "or drop it yourself (nothing was changed)")


def remove_leftovers(conn: psycopg.Connection, names: Names, keep: Sequence[str], settings: PublishSettings) -> list:
    """Tables of NAME's that nothing serves (a killed publish's), with their markers."""
    found = conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
                         "n.nspname = %s AND c.relkind IN ('r', 'u', 'p') AND (starts_with(relname, %s) OR "
                         "starts_with(relname, %s))", (names.schema, f"{DATA}{names.key}_",
                                                       f"{STAGING}{names.key}_")).fetchall()
    dropped = []
    for (table,) in found:
        if table in keep:
            continue
        if drop_table(conn, names, table, settings, attempts=1):
            dropped.append(table)
    return dropped


def drop_table(conn: psycopg.Connection, names: Names, table: str, settings: PublishSettings,
               attempts: int) -> bool:
    """TABLE and its markers, waiting for readers' locks at most lock_timeout each of ATTEMPTS."""
    for attempt in range(attempts):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(settings.lock_timeout_ms)))
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(names(table)))
                conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s").format(names(LOADS)), (table,))
            return True
        except errors.LockNotAvailable:
            if attempt + 1 < attempts:
                time.sleep(settings.swap_backoff_s)
        except errors.DependentObjectsStillExist as exc:   # made by the user since dependents.check_dependents
            detail = "; ".join((exc.diag.message_detail or "").splitlines())   # the server's list of them
            log.warning("%s is still read by objects of yours (%s): make them read %s, and the next publish "
                        "drops it", table, detail, names.qualified)
            return False
    log.warning("%s is still read by a query: the next publish drops it", table)
    return False


def create_data_table(conn: psycopg.Connection, names: Names, table: str, cols: Sequence[Column],
                      comment: str, fillfactor: int) -> None:
    """A model's data table, without indexes (they are built after the bulk load); its pages
    loaded to FILLFACTOR %, the room left for the updates of later deltas (update_sql)."""
    defs = [sql.SQL("{} {} NOT NULL" if c.name in KEY or c.name == "embedding" else "{} {}")
            .format(sql.Identifier(c.name), sql.SQL(c.type)) for c in cols]
    defs.append(sql.SQL("{} integer GENERATED ALWAYS AS {} STORED").format(sql.Identifier(BUCKET),
                                                                           sql.SQL(bucket_sql())))
    row_hash = hash_sql(list(cols), lambda n: sql.Identifier(n).as_string(conn))
    defs.append(sql.SQL("{} bigint GENERATED ALWAYS AS {} STORED").format(sql.Identifier(HASH), sql.SQL(row_hash)))
    conn.execute(sql.SQL("CREATE TABLE {} ({}) WITH (fillfactor = {})").format(
        names(table), sql.SQL(", ").join(defs), sql.Literal(fillfactor)))
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(names(table), sql.Literal(comment)))


def create_staging(conn: psycopg.Connection, names: Names, table: str, cols: Sequence[Column]) -> None:
    defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type)) for c in cols]
    conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(names(table), sql.SQL(", ").join(defs)))
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(
        names(table), sql.Literal(f"embedpipe: rows on their way to {names.qualified}")))


def work_mem_mb(rows: int, dimensions: int, settings: PublishSettings) -> int:
    """What the HNSW graph of ROWS needs in memory (pgvector keeps each element's vector and
    its neighbour lists: 2m on layer 0, m above), with room, up to the setting."""
    width = 2 * dimensions if dimensions > 2000 else 4 * dimensions
    need = rows * (width + 3 * settings.hnsw_m * 8 + 100) * 1.3 / 2 ** 20
    return int(max(64, min(settings.maintenance_work_mem_mb, need)))


def build_indexes(conn: psycopg.Connection, names: Names, table: str, dimensions: int, rows: int,
                  settings: PublishSettings, longest_id: int = 0) -> None:
    """The key's unique index (on the id's md5 above KEY_BYTES, with a hash index on the id:
    transforms/publish/columns.py), the HNSW index, the planner's statistics."""
    expression, opclass = index_expression(dimensions)
    conn.execute(sql.SQL("SET maintenance_work_mem = {}").format(
        sql.Literal(f"{work_mem_mb(rows, dimensions, settings)}MB")))
    conn.execute(sql.SQL("SET max_parallel_maintenance_workers = {}").format(
        sql.Literal(settings.parallel_index_workers)))
    conn.execute(sql.SQL("CREATE UNIQUE INDEX {} ON {} ({})").format(
        sql.Identifier(f"{table}_key"), names(table), sql.SQL(key_index(longest_id))))
    if longest_id > KEY_BYTES:
        conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hash (doc_id)").format(
            sql.Identifier(f"{table}_doc"), names(table)))
    conn.execute(sql.SQL("CREATE INDEX {} ON {} USING hnsw ({} {}) WITH (m = {}, ef_construction = {})").format(
        sql.Identifier(f"{table}_hnsw"), names(table), sql.SQL(expression), sql.SQL(opclass),
        sql.Literal(settings.hnsw_m), sql.Literal(settings.hnsw_ef_construction)))
    conn.execute(sql.SQL("ANALYZE {}").format(names(table)))
    conn.execute("RESET maintenance_work_mem")
    conn.execute("RESET max_parallel_maintenance_workers")


def aggregates(conn: psycopg.Connection, names: Names, table: str) -> tuple[list[int], list[int]]:
    """Per bucket: rows, and the xor of their hashes."""
    counts, hashes = [0] * BUCKETS, [0] * BUCKETS
    for bucket, n, x in conn.execute(sql.SQL("SELECT {b}, count(*), bit_xor({h}) FROM {t} GROUP BY {b}").format(
            b=sql.Identifier(BUCKET), h=sql.Identifier(HASH), t=names(table))):
        if bucket is not None and 0 <= bucket < BUCKETS:
            counts[bucket], hashes[bucket] = n, x
    return counts, hashes


def loaded(conn: psycopg.Connection, names: Names, table: str) -> tuple[int, int]:
    """(tasks, rows) the workers recorded as loaded into TABLE."""
    n, rows = one(conn.execute(sql.SQL("SELECT count(*), coalesce(sum(rows), 0) FROM {} WHERE target = %s")
                               .format(names(LOADS)), (table,)))
    return n, int(rows)


def table_rows(conn: psycopg.Connection, names: Names, table: str):
    """TABLE's keys and identities (pipeline/publish/delta.py), KEYS_BATCH rows at a time."""
    with conn.transaction(), conn.cursor(name="embedpipe_keys") as cur:
        cur.execute(sql.SQL("SELECT doc_id, chunk_index, token_start, run_id, text_sha256, request_id FROM {}")
                    .format(names(table)))
        while rows := cur.fetchmany(KEYS_BATCH):
            yield rows


def _changed(conn: psycopg.Connection, statement: sql.Composable, params=None) -> list[tuple[int, int, int]]:
    """(bucket, rows, xor of hashes) of the rows STATEMENT (a DELETE or INSERT ... RETURNING
    the bucket and hash columns) changed."""
    return conn.execute(sql.SQL("WITH changed AS ({}) SELECT b, count(*), bit_xor(h) FROM changed GROUP BY b")
                        .format(statement), params).fetchall()


@dataclasses.dataclass
class Checksums:
    counts: list[int]
    hashes: list[int]

    def apply(self, changes: list[tuple[int, int, int]], sign: int) -> int:
        """Rows deleted (SIGN -1) or inserted (+1) per bucket: the checksums after; the rows."""
        total = 0
        for bucket, n, x in changes:
            self.counts[bucket] += sign * n
            self.hashes[bucket] ^= x
            total += n
        return total


class Inexact(Exception):
    """A delta that would leave the table with other than the view's number of rows."""


def apply_delta(conn: psycopg.Connection, names: Names, record: Record, staging: str | None,
                cols: Sequence[Column], gone, drifted: list[int], sums: Checksums, make_record,
                recreate_view: bool) -> tuple[int, int, int]:
    """The delta in one transaction (readers see the table before it or after it, whole): the
    keys GONE and the DRIFTED buckets deleted, STAGING's rows applied (an update where the key
    is there, an insert where not), the record saved with the checksums SUMS carried through;
    rolled back (Inexact) when the rows they count are not the record's. (inserted, updated,
    deleted)."""
    data, key = names(record.data_table), _key_match()
    returning = sql.SQL("RETURNING d.{} AS b, d.{} AS h").format(sql.Identifier(BUCKET), sql.Identifier(HASH))
    with conn.transaction():
        deleted = 0
        if gone.num_rows:
            conn.execute("CREATE TEMP TABLE embedpipe_gone (doc_id text, chunk_index integer, token_start integer) "
                         "ON COMMIT DROP")
            with conn.cursor().copy("COPY embedpipe_gone FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(["text", "int4", "int4"])
                for row in zip(*(gone.column(k).to_pylist() for k in KEY), strict=True):
                    copy.write_row(row)
            deleted += sums.apply(_changed(conn, sql.SQL("DELETE FROM {} d USING embedpipe_gone s WHERE {} {}")
                                           .format(data, key, returning)), -1)
        if drifted:
            deleted += sums.apply(_changed(conn, sql.SQL("DELETE FROM {} d WHERE d.{} = ANY(%s) {}").format(
                data, sql.Identifier(BUCKET), returning), (drifted,)), -1)
        inserted = updated = 0
        if staging is not None:
            s = names(staging)
            # the rows an update replaces leave the checksums; their new versions enter them below
            sums.apply(conn.execute(sql.SQL("SELECT d.{b}, count(*), bit_xor(d.{h}) FROM {} d JOIN {} s ON {} "
                                            "GROUP BY d.{b}").format(data, s, key, b=sql.Identifier(BUCKET),
                                                                     h=sql.Identifier(HASH))).fetchall(), -1)
            updated = sums.apply(_changed(conn, update_sql(data, s, cols, returning)), +1)
            columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in cols)
            inserted = sums.apply(_changed(conn, sql.SQL(
                "INSERT INTO {} AS d ({}) SELECT {} FROM {} s WHERE NOT EXISTS (SELECT FROM {} d WHERE {}) {}").format(
                data, columns, columns, s, data, key, returning)), +1)
            conn.execute(sql.SQL("DROP TABLE {}").format(s))
            conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s").format(names(LOADS)), (staging,))
        if recreate_view:
            conn.execute(view_sql(names, record.data_table, cols, replace=False))
        new = make_record(sums)
        if sum(sums.counts) != new.rows:
            raise Inexact(f"{sum(sums.counts)} rows where the view has {new.rows}")
        save_record(conn, names, new)
    return inserted, updated, deleted


def _key_match() -> sql.Composed:
    return sql.SQL(" AND ").join(sql.SQL("d.{k} = s.{k}").format(k=sql.Identifier(k)) for k in KEY)


def update_sql(data: sql.Composable, staging: sql.Composable, cols: Sequence[Column],
               returning: sql.Composable) -> sql.Composed:
    """The rows of DATA whose key STAGING has, updated in place: one new tuple each. A vector
    whose bytes are the same keeps the stored value itself (not an equal copy, which the
    server would count as a change of the indexed column), so a row whose lineage alone
    changed can be a HOT update: no new entry in the HNSW index or the key's, when its page
    has room (the data table's fillfactor leaves some)."""
    sets = []
    for c in cols:
        if c.name in KEY:
            continue
        if c.copy_type == "vector":
            value = sql.SQL("CASE WHEN vector_send(d.{c}) = vector_send(s.{c}) THEN d.{c} ELSE s.{c} END")
        else:
            value = sql.SQL("s.{c}")
        sets.append(sql.SQL("{c} = ").format(c=sql.Identifier(c.name)) + value.format(c=sql.Identifier(c.name)))
    return sql.SQL("UPDATE {} d SET {} FROM {} s WHERE {} {}").format(data, sql.SQL(", ").join(sets), staging,
                                                                       _key_match(), returning)


def search_default(conn: psycopg.Connection, ef_search: int) -> bool:
    """hnsw.ef_search = EF_SEARCH in every later session of this role in this database (ALTER
    ROLE ... IN DATABASE ... SET: a psql user searches as `search` does; other roles and
    databases keep theirs). False, with a warning, where the server refuses it."""
    try:
        with conn.transaction():
            held = conn.execute("SELECT setconfig FROM pg_db_role_setting s JOIN pg_database d ON d.oid = "
                                "s.setdatabase WHERE d.datname = current_database() AND s.setrole = "
                                "(SELECT oid FROM pg_roles WHERE rolname = current_user)").fetchone()
            if held and f"hnsw.ef_search={ef_search}" in (held[0] or ()):
                return True
            conn.execute("SELECT '[0]'::vector")   # pgvector loaded: hnsw.ef_search is its setting, not a placeholder
            conn.execute(sql.SQL("ALTER ROLE CURRENT_USER IN DATABASE {} SET hnsw.ef_search = {}").format(
                sql.Identifier(one(conn.execute("SELECT current_database()"))[0]), sql.Literal(ef_search)))
    except psycopg.Error as exc:
        log.warning("hnsw.ef_search could not be made this role's default (%s): SET hnsw.ef_search = %d in each "
                    "session that searches", one_line(exc), ef_search)
        return False
    return True


def view_sql(names: Names, data_table: str, cols: Sequence[Column], replace: bool) -> sql.Composed:
    return sql.SQL("CREATE {}VIEW {} AS SELECT {} FROM {}").format(
        sql.SQL("OR REPLACE " if replace else ""), names(), sql.SQL(", ").join(sql.Identifier(c.name) for c in cols),
        names(data_table))


def _grants(conn: psycopg.Connection, names: Names) -> list[sql.Composed]:
    """The GRANTs that give NAME's privileges again, to all but its owner (a view made anew
    has none)."""
    found = conn.execute("SELECT a.privilege_type, a.is_grantable, r.rolname FROM pg_class c, aclexplode(c.relacl) a "
                         "LEFT JOIN pg_roles r ON r.oid = a.grantee WHERE c.oid = to_regclass(%s) AND "
                         "a.grantee <> c.relowner", (regclass(names.schema, names.name),)).fetchall()
    return [sql.SQL("GRANT {} ON {} TO {}{}").format(sql.SQL(privilege), names(),
                                                     sql.Identifier(role) if role else sql.SQL("PUBLIC"),
                                                     sql.SQL(" WITH GRANT OPTION" if grantable else ""))
            for privilege, grantable, role in found]


def swap(conn: psycopg.Connection, names: Names, data_table: str, cols: Sequence[Column], replace: bool,
         record: Record, settings: PublishSettings) -> int:
    """NAME reads DATA_TABLE from now on, and the record says so: one short transaction that
    waits for readers' locks at most lock_timeout, tried again until it gets through. A reader
    waits behind it at most that long. REPLACE: NAME keeps its columns first (CREATE OR
    REPLACE: what depends on it stays and reads the new rows); else it is dropped and made
    anew, with its grants. The attempts it took."""
    for attempt in range(1, settings.swap_attempts + 1):
        try:
            with conn.transaction():
                conn.execute(sql.SQL("SET LOCAL lock_timeout = {}").format(sql.Literal(settings.lock_timeout_ms)))
                grants = [] if replace else _grants(conn, names)
                if not replace:
                    conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(names()))
                conn.execute(view_sql(names, data_table, cols, replace=replace))
                for grant in grants:
                    conn.execute(grant)
                conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(names(), sql.Literal(
                    f"embedpipe: view {record.view} of {record.details.get('dir', 'DIR')} ({record.model}, "
                    f"{record.dimensions} dimensions); its record is in {META}")))
                save_record(conn, names, record)
                conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s").format(names(LOADS)), (data_table,))
            return attempt
        except errors.LockNotAvailable:
            log.info("the swap of %s waited %d ms for a reader's lock: trying again (%d of %d)", names.qualified,
                     settings.lock_timeout_ms, attempt, settings.swap_attempts)
            time.sleep(settings.swap_backoff_s)
    raise JobFailed(f"queries on {names.qualified} held it for {settings.swap_attempts} tries of "
                    f"{settings.lock_timeout_ms} ms: it serves what it did; publish again")


def nearest(conn: psycopg.Connection, names: Names, dimensions: int, kept: Sequence[str], query: sql.Composable,
            params: dict, k: int, ef_search: int, exclude_doc: str | None = None) -> list[dict]:
    """The K rows of NAME nearest (cosine) to QUERY, an SQL expression of a vector (PARAMS its
    values): through the HNSW index, ordering by the expression it indexes (a halfvec cast above
    2,000 dimensions), with EXCLUDE_DOC's rows left out."""
    expression, _ = index_expression(dimensions)
    cast = sql.SQL(f"::halfvec({dimensions})" if dimensions > 2000 else "")
    distance = sql.SQL("{} <=> ({}){}").format(sql.SQL(expression), query, cast)
    columns = sql.SQL(", ").join(sql.Identifier(c) for c in ("doc_id", "chunk_index", "token_start", "token_end",
                                                              *kept))
    where = sql.SQL("WHERE doc_id <> %(exclude)s") if exclude_doc is not None else sql.SQL("")
    with conn.transaction():
        conn.execute(sql.SQL("SET LOCAL hnsw.ef_search = {}").format(sql.Literal(ef_search)))
        if exclude_doc is not None:   # the filter drops the document's own chunks: the scan goes on for k more
            conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
        cur = conn.execute(sql.SQL("SELECT {}, 1 - ({}) AS similarity FROM {} {} ORDER BY {} LIMIT {}").format(
            columns, distance, names(), where, distance, sql.Literal(k)), {**params, "exclude": exclude_doc})
        found = [d.name for d in cur.description or ()]
        return [dict(zip(found, row, strict=True)) for row in cur]

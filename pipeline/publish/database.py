"""The launcher's statements: the lock, the record of what NAME serves, the tables beside it,
the delta's one transaction and the swap (the checks before them: checks.py; NAME's
definition: definition.py; the index: index.py).

What lives in NAME's schema:
- NAME: a view over the model's data table `embedpipe_data_<key>_<token>` (<key>: 8 hex of
  NAME, so that a publish finds its own tables and never another NAME's);
- `embedpipe_published`: one row per NAME, the record (the view of DIR served, model,
  dimensions, columns, rows, the per-bucket checksum of transforms/publish/columns.py);
- `embedpipe_staging_<key>_<token>`: a delta's rows before they are applied, and the keys it
  deletes within its transaction (unlogged);
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
import time
from collections.abc import Iterator, Sequence

import psycopg
from psycopg import errors, sql

from pipeline.exits import JobFailed, UsageError
from pipeline.publish.definition import define
from pipeline.publish.index import Index
from pipeline.publish.names import Names
from pipeline.publish.target import Database
from pipeline.settings.config import PublishSettings
from transforms.errors import one_line
from transforms.publish.columns import (BUCKET, BUCKETS, CHUNK_ID, HASH, KEY, TEXT, TSV, Column, bucket_sql,
                                        chunk_id_sql, hash_sql, tsv_sql)
from transforms.publish.load import connect as open_connection
from transforms.publish.sql import LOADS, one

log = logging.getLogger("embedpipe")

META = "embedpipe_published"
DATA, STAGING = "embedpipe_data_", "embedpipe_staging_"
FORMAT = 1
KEYS_BATCH = 50_000   # rows of keys a fetch brings to the launcher (a few MB)


def connect(db: Database, settings: PublishSettings) -> psycopg.Connection:
    try:
        return open_connection(db.url, settings.connect_timeout_s, "publish")
    except psycopg.OperationalError as exc:
        raise JobFailed(f"could not connect to the database at {db.shown}: {one_line(exc)}") from None


def schema_of(conn: psycopg.Connection, db: Database, schema: str | None) -> str:
    """SCHEMA, or the search_path's first when not given, checked to exist."""
    if schema is None:
        schema = one(conn.execute("SELECT current_schema()"))[0]
        if schema is None:
            raise UsageError(f"no schema of the search_path exists in {db.shown}: give --table SCHEMA.TABLE")
    elif conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (schema,)).fetchone() is None:
        raise UsageError(f"schema {schema} does not exist in {db.shown}")
    return schema


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
    index: str = Index.UNNAMED              # the data table's HNSW index (Index.signature)
    text_search: str | None = None          # text_tsv's configuration (None: a table without it)
    details: dict = dataclasses.field(default_factory=dict)   # shown, never compared


def load_record(conn: psycopg.Connection, names: Names) -> Record | None:
    row = conn.execute(sql.SQL("SELECT record, bucket_counts, bucket_hashes FROM {} WHERE name = %s")
                       .format(names(META)), (names.name,)).fetchone()
    if row is None:
        return None
    doc, counts, hashes = row
    return Record(doc["data_table"], doc["view"], doc["model"], doc["dimensions"],
                  tuple(tuple(c) for c in doc["columns"]), doc["rows"], tuple(counts), tuple(hashes),
                  index=doc.get("index", Index.UNNAMED), text_search=doc.get("text_search"), details=doc)


def save_record(conn: psycopg.Connection, names: Names, record: Record) -> None:
    doc = {**record.details, "format": FORMAT, "data_table": record.data_table, "view": record.view,
           "model": record.model, "dimensions": record.dimensions, "columns": [list(c) for c in record.columns],
           "rows": record.rows, "index": record.index, "text_search": record.text_search}
    conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s, %s) ON CONFLICT (name) DO UPDATE SET "
                         "record = EXCLUDED.record, bucket_counts = EXCLUDED.bucket_counts, "
                         "bucket_hashes = EXCLUDED.bucket_hashes").format(names(META)),
                 (names.name, json.dumps(doc), list(record.counts), list(record.hashes)))


def relkind(conn: psycopg.Connection, schema: str, name: str) -> str | None:
    row = conn.execute("SELECT c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                       "WHERE n.nspname = %s AND c.relname = %s", (schema, name)).fetchone()
    return row[0] if row else None


def remove_leftovers(conn: psycopg.Connection, names: Names, keep: Sequence[str], settings: PublishSettings) -> list:
    """Tables of NAME's that nothing serves (a killed publish's), with their markers; those of
    another role's publish are left to it."""
    found = conn.execute("SELECT relname, pg_has_role(relowner, 'USAGE'), pg_get_userbyid(relowner) FROM pg_class c "
                         "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = %s AND c.relkind IN "
                         "('r', 'u', 'p') AND (starts_with(relname, %s) OR starts_with(relname, %s))",
                         (names.schema, f"{DATA}{names.key}_", f"{STAGING}{names.key}_")).fetchall()
    dropped = []
    for table, ours, owner in found:
        if table in keep:
            continue
        if not ours:
            log.warning("%s, left by a publish of role %s, stays: that role's next publish drops it", table, owner)
        elif drop_table(conn, names, table, settings, attempts=1):
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
                      comment: str, fillfactor: int, text_search: str) -> None:
    """A model's data table, without indexes (they are built after the bulk load); its pages
    loaded to FILLFACTOR %, the room left for the updates of later deltas (update_sql);
    text_tsv in the text search configuration TEXT_SEARCH."""
    defs = [sql.SQL("{} {} NOT NULL" if c.name in (*KEY, TEXT, "embedding") else "{} {}")
            .format(sql.Identifier(c.name), sql.SQL(c.type)) for c in cols]
    generated = ((CHUNK_ID, "text", chunk_id_sql()), (TSV, "tsvector", tsv_sql(sql.Literal(text_search).as_string(conn))),
                 (BUCKET, "integer", bucket_sql()),
                 (HASH, "bigint", hash_sql(list(cols), lambda n: sql.Identifier(n).as_string(conn))))
    defs += [sql.SQL("{} {} GENERATED ALWAYS AS {} STORED").format(sql.Identifier(name), sql.SQL(type_),
                                                                    sql.SQL(f"({expression})"))
             for name, type_, expression in generated]
    conn.execute(sql.SQL("CREATE TABLE {} ({}) WITH (fillfactor = {})").format(
        names(table), sql.SQL(", ").join(defs), sql.Literal(fillfactor)))
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(names(table), sql.Literal(comment)))


def create_staging(conn: psycopg.Connection, names: Names, table: str, cols: Sequence[Column]) -> None:
    defs = [sql.SQL("{} {}").format(sql.Identifier(c.name), sql.SQL(c.type)) for c in cols]
    conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} ({})").format(names(table), sql.SQL(", ").join(defs)))
    conn.execute(sql.SQL("COMMENT ON TABLE {} IS {}").format(
        names(table), sql.Literal(f"embedpipe: rows on their way to {names.qualified}")))


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
                redefine: bool | None) -> tuple[int, int, int]:
    """The delta in one transaction (readers see the table before it or after it, whole): the
    keys GONE and the DRIFTED buckets deleted, STAGING's rows applied (an update where the key
    is there, an insert where not), NAME defined again unless REDEFINE is None (True: CREATE OR
    REPLACE, False: made anew: definition.define), the record saved with the checksums SUMS
    carried through; rolled back (Inexact) when the rows they count are not the record's.
    (inserted, updated, deleted)."""
    data, key = names(record.data_table), _key_match()
    returning = sql.SQL("RETURNING d.{} AS b, d.{} AS h").format(sql.Identifier(BUCKET), sql.Identifier(HASH))
    with conn.transaction():
        deleted = 0
        if gone.num_rows:   # in a table of the schema's (a temporary one needs TEMP on the database)
            keys = names(names.new(STAGING))
            conn.execute(sql.SQL("CREATE UNLOGGED TABLE {} (doc_id text, chunk_index integer, token_start integer)")
                         .format(keys))
            with conn.cursor().copy(sql.SQL("COPY {} FROM STDIN (FORMAT BINARY)").format(keys)) as copy:
                copy.set_types(["text", "int4", "int4"])
                for row in zip(*(gone.column(k).to_pylist() for k in KEY), strict=True):
                    copy.write_row(row)
            deleted += sums.apply(_changed(conn, sql.SQL("DELETE FROM {} d USING {} s WHERE {} {}")
                                           .format(data, keys, key, returning)), -1)
            conn.execute(sql.SQL("DROP TABLE {}").format(keys))
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
            # the rows whose text stays first: once updated, those whose text changes are the others still
            updated = sum(sums.apply(_changed(conn, update_sql(data, s, cols, returning, text)), +1)
                          for text in (False, True))
            columns = sql.SQL(", ").join(sql.Identifier(c.name) for c in cols)
            inserted = sums.apply(_changed(conn, sql.SQL(
                "INSERT INTO {} AS d ({}) SELECT {} FROM {} s WHERE NOT EXISTS (SELECT FROM {} d WHERE {}) {}").format(
                data, columns, columns, s, data, key, returning)), +1)
            conn.execute(sql.SQL("DROP TABLE {}").format(s))
            conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s").format(names(LOADS)), (staging,))
        new = make_record(sums)
        if redefine is not None:
            define(conn, names, record.data_table, cols, redefine, comment(new))
        if sum(sums.counts) != new.rows:
            raise Inexact(f"{sum(sums.counts)} rows where the view has {new.rows}")
        save_record(conn, names, new)
    return inserted, updated, deleted


def _key_match() -> sql.Composed:
    return sql.SQL(" AND ").join(sql.SQL("d.{k} = s.{k}").format(k=sql.Identifier(k)) for k in KEY)


def update_sql(data: sql.Composable, staging: sql.Composable, cols: Sequence[Column],
               returning: sql.Composable, text: bool) -> sql.Composed:
    """The rows of DATA whose key STAGING has, updated in place: one new tuple each; TEXT: the
    rows whose text changed, else the others, whose text is left out of the SET (text_tsv is
    computed again only when its text is set: a row whose lineage alone changed costs no
    to_tsvector). A vector whose bytes are the same keeps the stored value itself (not an
    equal copy, which the server would count as a change of the indexed column). A row whose
    vector and text stayed (its lineage changed) can then be a HOT update: no new entry in the
    HNSW index, the GIN index or the key's, when its page has room (the data table's
    fillfactor leaves some)."""
    sets = []
    for c in cols:
        if c.name in KEY or (c.name == TEXT and not text):
            continue
        if c.copy_type == "vector":
            value = sql.SQL("CASE WHEN vector_send(d.{c}) = vector_send(s.{c}) THEN d.{c} ELSE s.{c} END")
        else:
            value = sql.SQL("s.{c}")
        sets.append(sql.SQL("{c} = ").format(c=sql.Identifier(c.name)) + value.format(c=sql.Identifier(c.name)))
    same = sql.SQL("d.{t} IS DISTINCT FROM s.{t} COLLATE \"C\"" if text else "d.{t} = s.{t} COLLATE \"C\"").format(
        t=sql.Identifier(TEXT))
    return sql.SQL("UPDATE {} d SET {} FROM {} s WHERE {} AND {} {}").format(
        data, sql.SQL(", ").join(sets), staging, _key_match(), same, returning)


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


def comment(record: Record) -> str:
    """NAME's comment: what it serves."""
    return (f"embedpipe: view {record.view} of {record.details.get('dir', 'DIR')} ({record.model}, "
            f"{record.dimensions} dimensions); its record is in {META}")


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
                define(conn, names, data_table, cols, replace, comment(record))
                save_record(conn, names, record)
                conn.execute(sql.SQL("DELETE FROM {} WHERE target = %s").format(names(LOADS)), (data_table,))
            return attempt
        except errors.LockNotAvailable:
            log.info("the swap of %s waited %d ms for a reader's lock: trying again (%d of %d)", names.qualified,
                     settings.lock_timeout_ms, attempt, settings.swap_attempts)
            time.sleep(settings.swap_backoff_s)
    raise JobFailed(f"queries on {names.qualified} held it for {settings.swap_attempts} tries of "
                    f"{settings.lock_timeout_ms} ms: it serves what it did; publish again")

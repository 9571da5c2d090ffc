"""What a publish checks before it writes anything: NAME's schema and the rights the publish
needs there, pgvector (its version takes the index NAME's length needs), the text search
configuration of text_tsv, NAME free or a view a publish made, and no type of NAME's name (a
view's name is its row type's too).

pgvector and the tables every NAME of the schema shares are made in the transaction that
checks the rest, so a refusal leaves nothing made (transactional DDL). A publish needs no
right on the database beyond CONNECT (no TEMP: a delta's keys to delete go in a table of the
schema, made and dropped within its transaction).
"""
from __future__ import annotations

from collections.abc import Callable

import psycopg
from psycopg import errors, sql

from pipeline.exits import JobFailed, UsageError
from pipeline.publish.database import META, Record, advisory_key, load_record, lock_timeout, relkind, schema_of
from pipeline.publish.definition import reads_from
from pipeline.publish.index import Index
from pipeline.publish.names import Names, regclass
from pipeline.publish.target import Database
from transforms.publish.sql import LOADS, create_loads, ident, one

RIGHTS = ("SELECT", "INSERT", "UPDATE", "DELETE")   # on the shared tables


def resolve(conn: psycopg.Connection, db: Database, schema: str | None, name: str, index: Index,
            text_search: str, wait_s: float) -> tuple[Names, str]:
    """NAME in its schema (schema_of) and the configuration TEXT_SEARCH as the server names it,
    every check passed, the shared tables made (waiting at most WAIT_S for another publish
    making them)."""
    names = Names(schema_of(conn, db, schema), name)
    role, may_create = one(conn.execute("SELECT current_user, has_schema_privilege(%s, 'CREATE')", (names.schema,)))
    if not may_create:
        raise JobFailed(f"role {role} may not create tables in schema {names.schema} of {db.shown}: grant it CREATE "
                        "there, or publish as a role that has it")
    found = []

    def checks() -> None:
        pgvector_takes(conn, db, index)
        found.append(text_search_config(conn, db, text_search))
        check_rights(conn, db, names, None)   # the record is read from a shared table
        record = load_record(conn, names)
        check_ours(conn, names, record)
        check_rights(conn, db, names, record)
    shared_tables(conn, db, names.schema, wait_s, checks)
    return names, found[0]


def text_search_config(conn: psycopg.Connection, db: Database, config: str) -> str:
    """CONFIG (publish.text_search_config) as the server names it (`english`, `public.mine`);
    UsageError when the server has no such text search configuration."""
    try:
        with conn.transaction():   # a savepoint: the caller's transaction goes on
            row = conn.execute("SELECT oid::regconfig::text FROM pg_ts_config WHERE oid = %s::regconfig",
                               (config,)).fetchone()   # the catalogue's: regconfig reads digits as any oid
    except (errors.UndefinedObject, errors.InvalidName, errors.InvalidSchemaName, errors.SyntaxError,
            errors.FeatureNotSupported, psycopg.DataError):
        row = None
    found = row[0] if row else None
    if found is None:
        have = [r[0] for r in conn.execute("SELECT cfgname FROM pg_ts_config WHERE pg_ts_config_is_visible(oid) "
                                           "ORDER BY cfgname")]
        raise UsageError(f"publish.text_search_config {config!r} is not a text search configuration of the server at "
                         f"{db.shown} (it has {', '.join(have)}): set one of them in the --run-config file "
                         "(nothing was changed)")
    return str(found)


def shared_tables(conn: psycopg.Connection, db: Database, schema: str, wait_s: float,
                  then: Callable[[], None] | None = None) -> None:
    """pgvector in the database, and the tables every NAME of SCHEMA shares (the markers, the
    records), made once, THEN run in the same transaction (its error undoes them): under an
    advisory lock of the database, since two publishes making them at once (of two NAMEs: each
    holds only its own NAME's lock) would race on the catalogue's unique indexes (IF NOT EXISTS
    looks before it inserts)."""
    with lock_timeout(conn, wait_s), conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (advisory_key("shared tables"),))
        _vector(conn, db)
        conn.execute(create_loads(schema))
        conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} (name text PRIMARY KEY, record jsonb NOT NULL, "
                             "bucket_counts integer[] NOT NULL, bucket_hashes bigint[] NOT NULL)").format(
            ident(schema, META)))
        if then is not None:
            then()


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


def pgvector_takes(conn: psycopg.Connection, db: Database, index: Index) -> None:
    """The database's pgvector has what INDEX needs."""
    version = one(conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'"))[0]
    if (lacking := index.lacking_in(version)) is not None:
        raise JobFailed(f"pgvector {version} in the database of {db.shown} has no {lacking}: update it there "
                        "(ALTER EXTENSION vector UPDATE, after installing a newer pgvector on the server) "
                        "(nothing was changed)")


def check_ours(conn: psycopg.Connection, names: Names, record: Record | None) -> None:
    """NAME is free, or a view a publish made: anything else is the user's, never touched. No
    type of the schema has its name (pgvector's `vector`, a type of the user's), which the
    view's row type would take."""
    kind = relkind(conn, names.schema, names.name)
    if kind is not None and (record is None or kind != "v" or not reads_from(conn, names, record.data_table)):
        raise UsageError(f"{names.qualified} exists and is not a table embedpipe publishes: give another --table, "
                         "or drop it yourself (nothing was changed)")
    if kind is None and conn.execute(
            "SELECT 1 FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = %s AND "
            "t.typname = %s AND t.typcategory <> 'A'", (names.schema, names.name)).fetchone():
        raise UsageError(f"{names.qualified} is the name of a type in schema {names.schema}, which a view's row "
                         "type cannot take: give another --table (nothing was changed)")


def check_rights(conn: psycopg.Connection, db: Database, names: Names, record: Record | None) -> None:
    """The rights this publish needs on what is there already: on the shared tables (another
    role may have made them) when RECORD is None, else the ownership of NAME and of RECORD's
    data table, which it replaces or drops. JobFailed naming those it lacks."""
    missing = []
    if record is None:
        for table in (META, LOADS):
            rel = regclass(names.schema, table)
            lacking = [p for p in RIGHTS if not one(conn.execute("SELECT has_table_privilege(%s, %s)", (rel, p)))[0]]
            if lacking:
                missing.append(f"{', '.join(lacking)} on {names.schema}.{table}")
        if not one(conn.execute("SELECT has_table_privilege('pg_catalog.pg_stat_activity', 'SELECT')"))[0]:
            missing.append("SELECT on pg_catalog.pg_stat_activity (a swap reads which sessions hold old snapshots)")
    else:
        for table in (names.name, record.data_table):
            owner = conn.execute("SELECT pg_get_userbyid(relowner), pg_has_role(relowner, 'USAGE') FROM pg_class "
                                 "WHERE oid = to_regclass(%s)", (regclass(names.schema, table),)).fetchone()
            if owner is not None and not owner[1]:
                missing.append(f"ownership of {names.schema}.{table} (owned by {owner[0]})")
    if missing:
        role = one(conn.execute("SELECT current_user"))[0]
        raise JobFailed(f"role {role} lacks rights this publish needs in {db.shown}: {'; '.join(missing)}; grant "
                        "them to it, or publish as a role that has them (nothing was changed)")

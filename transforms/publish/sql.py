"""The workers' statements: the load's markers and the COPY (identifiers always quoted).

`embedpipe_loads` (in the published table's schema) holds one row per task loaded into a
table that is not served yet (a staging table, or a model's table being built); the launcher
counts them after the job, and drops them with the table.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

LOADS = "embedpipe_loads"


def one(cur: psycopg.Cursor[Any]) -> tuple[Any, ...]:
    """The row of a statement that always returns one (an aggregate, a function's value)."""
    row = cur.fetchone()
    if row is None:
        raise psycopg.ProgrammingError("a statement that always returns a row returned none")
    return tuple(row)


def ident(schema: str, name: str) -> sql.Composed:
    return sql.SQL(".").join([sql.Identifier(schema), sql.Identifier(name)])


def create_loads(schema: str) -> sql.Composed:
    return sql.SQL("CREATE TABLE IF NOT EXISTS {} (target text NOT NULL, task integer NOT NULL, "
                   "rows integer NOT NULL, PRIMARY KEY (target, task))").format(ident(schema, LOADS))


def mark_loaded(conn: psycopg.Connection, schema: str, table: str, task: int, rows: int) -> bool:
    """Record TASK as loaded into TABLE, in the caller's transaction; False: it was already (a
    concurrent attempt waits here for the other's commit, then finds it)."""
    done = conn.execute(sql.SQL("INSERT INTO {} VALUES (%s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1")
                        .format(ident(schema, LOADS)), (table, task, rows)).fetchone()
    return done is not None


def copy_in(schema: str, table: str, columns: Sequence[str]) -> sql.Composed:
    return sql.SQL("COPY {} ({}) FROM STDIN (FORMAT BINARY)").format(
        ident(schema, table), sql.SQL(", ").join(map(sql.Identifier, columns)))

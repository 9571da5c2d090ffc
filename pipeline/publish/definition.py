"""NAME itself: the view over the data table, its definition as the server shows it, and how
a publish makes it (again).

NAME is `SELECT <the columns> FROM <data table>`, `embedding` shown as an unconstrained
`vector` (pipeline/publish/index.py), the generated columns after the contract's
(transforms/publish/columns.py). A NAME that reads the data table but is defined
otherwise (redefined by hand: a WHERE, a column left out) serves other rows than the view: a
publish compares NAME's definition and columns, as pg_get_viewdef and format_type show them,
with those of the view it would make (made under another name in a transaction rolled back,
so that the server words both alike), and defines it again when they differ.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import psycopg
from psycopg import sql

from pipeline.publish.index import VIEW_EMBEDDING
from pipeline.publish.names import Names, regclass
from transforms.publish.columns import CONTRACT, GENERATED, Column

PROBE = "embedpipe_probe_"   # what a publish makes to read the server's form of NAME, never committed


def view_sql(names: Names, data_table: str, cols: Sequence[Column], replace: bool,
             view: str | None = None) -> sql.Composed:
    """NAME (or VIEW, beside it) over DATA_TABLE."""
    shown = [sql.SQL("{} AS {}").format(sql.SQL(VIEW_EMBEDDING), sql.Identifier(c.name)) if c.name == "embedding"
             else sql.Identifier(c.name) for c in cols]
    shown[len(CONTRACT):len(CONTRACT)] = [sql.Identifier(name) for name, _ in GENERATED]
    return sql.SQL("CREATE {}VIEW {} AS SELECT {} FROM {}").format(
        sql.SQL("OR REPLACE " if replace else ""), names(view), sql.SQL(", ").join(shown), names(data_table))


@dataclasses.dataclass(frozen=True)
class Definition:
    text: str                                # pg_get_viewdef
    columns: tuple[tuple[str, str], ...]     # (name, type as format_type shows it), in order

    def change_to(self, new: Definition) -> str | None:
        """What CREATE OR REPLACE VIEW cannot do from this view to NEW (it keeps the columns,
        the same names and types first, and adds others after): None when it can."""
        if new.columns[:len(self.columns)] == self.columns:
            return None
        types = dict(new.columns)
        name, was = next(c for c, n in itertools.zip_longest(self.columns, new.columns) if c != n)
        if name not in types:
            return f"its column {name} goes"
        if types[name] != was:
            return f"its column {name} changes from {was} to {types[name]}"
        return f"its column {name} moves"


def definition(conn: psycopg.Connection, schema: str, name: str) -> Definition | None:
    """The view SCHEMA.NAME as the server shows it; None when it is not a view."""
    rel = regclass(schema, name)
    row = conn.execute("SELECT pg_get_viewdef(c.oid) FROM pg_class c WHERE c.oid = to_regclass(%s) AND "
                       "c.relkind = 'v'", (rel,)).fetchone()
    if row is None:
        return None
    columns = conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                           "to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum", (rel,)).fetchall()
    return Definition(row[0], tuple((n, t) for n, t in columns))


def expected(conn: psycopg.Connection, names: Names, cols: Sequence[Column], data_table: str | None) -> Definition:
    """NAME as this publish defines it over DATA_TABLE (None: over a table of COLS yet to be
    made, whose columns alone then count): made beside it and rolled back."""
    found = None
    with conn.transaction():
        table = data_table or names.new(PROBE)
        if data_table is None:
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(names(table), sql.SQL(", ").join(
                sql.SQL("{} {}").format(sql.Identifier(name), sql.SQL(type_))
                for name, type_ in [*((c.name, c.type) for c in cols), *GENERATED])))
        probe = names.new(PROBE)
        conn.execute(view_sql(names, table, cols, replace=False, view=probe))
        found = definition(conn, names.schema, probe)
        raise psycopg.Rollback()
    assert found is not None   # the view was just made
    return found


def reads_from(conn: psycopg.Connection, names: Names, data_table: str) -> bool:
    """Whether NAME is a view over DATA_TABLE (as a publish made it)."""
    row = conn.execute("SELECT 1 FROM pg_rewrite r JOIN pg_depend d ON d.objid = r.oid AND d.classid = "
                       "'pg_rewrite'::regclass WHERE r.ev_class = to_regclass(%s) AND d.refobjid = to_regclass(%s)",
                       (regclass(names.schema, names.name), regclass(names.schema, data_table))).fetchone()
    return row is not None


def define(conn: psycopg.Connection, names: Names, data_table: str, cols: Sequence[Column], replace: bool,
           comment: str) -> None:
    """NAME over DATA_TABLE, in the caller's transaction. REPLACE: CREATE OR REPLACE (what
    depends on NAME stays and reads the new rows); else NAME is dropped, if there, and made
    anew with its grants."""
    grants = [] if replace else _grants(conn, names)
    if not replace:
        conn.execute(sql.SQL("DROP VIEW IF EXISTS {}").format(names()))
    conn.execute(view_sql(names, data_table, cols, replace=replace))
    for grant in grants:
        conn.execute(grant)
    conn.execute(sql.SQL("COMMENT ON VIEW {} IS {}").format(names(), sql.Literal(comment)))


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

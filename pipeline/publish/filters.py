"""`search --where COLUMN=VALUE`: the column one of NAME's, its value typed by the column's type as
the catalogue names it, checked by the server before anything is paid, and bound as a parameter.

A column's name may hold `=` itself: COLUMN is the longest part before an `=` that names one of
NAME's columns (the part before the first `=` when none does). Values of one column are alternatives (COLUMN IN (...)); columns are all required (AND). The
server parses each value as it would the column's own literal (`'2026-01-01'::date`,
`'{"a": 1}'::jsonb`), so whatever it accepts for the type is accepted here, and nothing of the
value is ever part of the statement's text.
"""
from __future__ import annotations

import difflib
from collections.abc import Collection

import psycopg
from psycopg import sql

from pipeline.exits import UsageError
from pipeline.publish.names import Names, regclass
from pipeline.publish.search import UNFILTERED, Filter
from transforms.errors import one_line


def parse(items: list[str], names: Collection[str] = ()) -> list[tuple[str, str]]:
    """COLUMN=VALUE items as (column, value): split at the last '=' whose prefix is one of NAMES,
    else at the first."""
    out = []
    for item in items:
        column, sep, value = item.partition("=")
        cuts = [i for i, ch in enumerate(item) if ch == "=" and item[:i] in names]
        if cuts:
            column, value = item[:cuts[-1]], item[cuts[-1] + 1:]
        if not sep or not column:
            raise UsageError(f"--where {item}: give COLUMN=VALUE (a column of the table, then '=', then its value)")
        if "\x00" in item:
            raise UsageError(f"--where {column}: the value holds a NUL character, which no PostgreSQL value holds")
        out.append((column, value))
    return out


def columns(conn: psycopg.Connection, names: Names) -> dict[str, str]:
    """NAME's columns and their types, as the catalogue names them (format_type), in order."""
    rows = conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                        "to_regclass(%s) AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
                        (regclass(names.schema, names.name),)).fetchall()
    return {name: type_ for name, type_ in rows}


def _nearest(column: str, usable: list[str]) -> list[str]:
    """The column of USABLE that COLUMN likely meant: equal ignoring case, or close to it."""
    folded = {c.casefold(): c for c in usable}
    return [folded[c] for c in difflib.get_close_matches(column.casefold(), list(folded), n=1)]


def resolve(conn: psycopg.Connection, names: Names, items: list[str]) -> tuple[Filter, ...]:
    """ITEMS (COLUMN=VALUE) with their columns checked against NAME's, each value cast by the
    server to its column's type (in a transaction rolled back: it reads nothing). UsageError
    naming a column NAME lacks, or a value and the type it is not a value of."""
    types = columns(conn, names)
    usable = [c for c in types if c not in UNFILTERED]
    values: dict[str, list[str]] = {}
    for column, value in parse(items, types):
        if column not in usable:
            close = _nearest(column, usable)
            why = "has no column" if column not in types else "takes no --where on its column"
            raise UsageError(f"--where {column}=...: {names.qualified} {why} {column}"
                             + (f" (did you mean {close[0]}?)" if close else "") + f"; its columns: {', '.join(usable)}")
        values.setdefault(column, []).append(value)
    for column, vals in values.items():
        for value in vals:
            try:
                with conn.transaction():
                    conn.execute(sql.SQL("SELECT %s::{}").format(sql.SQL(types[column])), (value,))
            except psycopg.DataError as exc:
                raise UsageError(f"--where {column}={value!r}: not a value of {column}'s type {types[column]} "
                                 f"({one_line(exc)})") from None
    return tuple(Filter(c, types[c], tuple(v)) for c, v in values.items())

"""The user's own objects on NAME and on its data table (views, materialized views, functions
with an SQL body, rules, triggers, foreign keys): found before a build, which is refused when
its swap would drop what they need. embedpipe never drops them; docs/postgres.md says what a
swap keeps."""
from __future__ import annotations

import psycopg

from pipeline.exits import UsageError
from pipeline.publish.database import Record
from pipeline.publish.names import Names, regclass
from transforms.publish.sql import one

# The user's objects that depend on a relation REL (its oid): those that read it or its row
# type (views, materialized views, functions with an SQL body, rules and foreign keys of
# other tables), as the server names them (a view's rule by its view), and the rules and
# triggers on REL itself, which go with it when it is dropped. Not REL's own generated
# columns, nor the rules of NOT_OF (NAME's, which reads the data table).
_DEPENDENTS = """
WITH refs(classid, objid) AS (
    SELECT 'pg_class'::regclass, %(rel)s::oid
    UNION ALL SELECT 'pg_type'::regclass, reltype FROM pg_class WHERE oid = %(rel)s
    UNION ALL SELECT 'pg_class'::regclass, indexrelid FROM pg_index WHERE indrelid = %(rel)s)
SELECT CASE WHEN r.rulename = '_RETURN' THEN pg_describe_object('pg_class'::regclass, r.ev_class, 0)
            ELSE pg_describe_object(d.classid, d.objid, 0) END
FROM pg_depend d JOIN refs ON d.refclassid = refs.classid AND d.refobjid = refs.objid
LEFT JOIN pg_rewrite r ON d.classid = 'pg_rewrite'::regclass AND r.oid = d.objid
LEFT JOIN pg_attrdef a ON d.classid = 'pg_attrdef'::regclass AND a.oid = d.objid
WHERE d.deptype = 'n' AND (r.oid IS NULL OR r.ev_class NOT IN (%(rel)s, %(not_of)s))
    AND (a.oid IS NULL OR a.adrelid <> %(rel)s)
UNION SELECT pg_describe_object('pg_rewrite'::regclass, oid, 0) FROM pg_rewrite
    WHERE ev_class = %(rel)s AND rulename <> '_RETURN'
UNION SELECT pg_describe_object('pg_trigger'::regclass, oid, 0) FROM pg_trigger
    WHERE tgrelid = %(rel)s AND NOT tgisinternal
ORDER BY 1"""


def dependents(conn: psycopg.Connection, names: Names, table: str, not_of: str | None = None) -> list[str]:
    """The objects of the user's that depend on TABLE of NAME's schema (_DEPENDENTS)."""
    rel, other = one(conn.execute("SELECT to_regclass(%s)::oid, coalesce(to_regclass(%s)::oid, 0)",
                                  (regclass(names.schema, table), regclass(names.schema, not_of or table))))
    if rel is None:
        return []
    return [r[0] for r in conn.execute(_DEPENDENTS, {"rel": rel, "not_of": other})]


def check_dependents(conn: psycopg.Connection, names: Names, record: Record | None, replace: bool,
                     change: str) -> None:
    """Refused before anything is built (exit 2: the user's objects, which embedpipe never
    drops, are in the way; the same command fails until they are moved): a build whose swap
    would drop what the user's objects need. The swap keeps NAME when it REPLACEs it (the
    objects on NAME then read the new rows), else drops it (CHANGE says why); it always drops
    the served data table."""
    if record is not None:
        on_data = dependents(conn, names, record.data_table, not_of=names.name)
        if on_data:
            raise UsageError(f"objects of yours read embedpipe's data table {names.schema}.{record.data_table}, "
                             f"which this publish replaces with a new one: {', '.join(on_data)}; make them read "
                             f"{names.qualified} instead (or drop them), then publish again (nothing was changed)")
    on_name = [] if replace else dependents(conn, names, names.name)
    if on_name:
        raise UsageError(f"{names.qualified} is made anew for this view ({change}), and objects of yours depend on it: "
                         f"{', '.join(on_name)}; drop them, publish again, then create them again (nothing was "
                         "changed)")

"""One line for a database error in the middle of a publish (NAME serves what it did): what
the server said, with its SQLSTATE, and "publish again" only where trying again can help,
decided by the SQLSTATE's class (PostgreSQL's Appendix A)."""
from __future__ import annotations

import psycopg

from pipeline.publish.target import Database
from transforms.errors import one_line

AGAIN = "publish again"
KEPT = "it serves what it did before"
# Classes of a state that may pass: the connection (08; 57P: the session ended by the server,
# its restart), a transaction rolled back by the server (40: serialization, deadlock), a lock or
# object in use (55), a statement cancelled (57014; a statement_timeout is told apart)
_PASSING = ("08", "40", "55", "57")
_PASSING_STATES = ("53300",)   # too many connections


def failure(exc: psycopg.Error, db: Database, name: str) -> str:
    state = exc.sqlstate or ""
    said = one_line(exc) + (f" (SQLSTATE {state})" if state else "")
    head = f"publishing to {name} failed"
    if state.startswith("22"):   # the same rows would meet it again
        return f"{head}: the view holds a value PostgreSQL does not take: {said}; {KEPT}"
    if state.startswith("54"):
        return (f"{head}: it reached a limit of PostgreSQL: {said}; {KEPT}, and publishing the same view meets the "
                "limit again")
    if state == "42501":
        return f"{head}: this role lacks a right: {said}; {KEPT}: grant it, then {AGAIN}"
    if state == "53100":
        return f"{head}: the database server's disk is full: {said}; {KEPT}: free space there, then {AGAIN}"
    if state == "53200":
        return (f"{head}: the database server ran out of memory: {said}; {KEPT}: give it more, or lower "
                f"publish.maintenance_work_mem_mb (what an index build takes), then {AGAIN}")
    if state == "57014" and "statement timeout" in said:
        return (f"{head}: a statement ran longer than the server's statement_timeout: {said}; {KEPT}: raise it for "
                f"the role that publishes (ALTER ROLE ... SET statement_timeout), then {AGAIN}")
    if state.startswith(("08", "57P")) or (not state and isinstance(exc, psycopg.OperationalError)):
        return f"{head}: the connection to {db.shown} was lost: {said}; {KEPT}: {AGAIN}"
    if state.startswith(_PASSING) or state in _PASSING_STATES:
        return f"{head}: {said}; {KEPT}: {AGAIN}"
    return f"{head}: {said}; {KEPT}"

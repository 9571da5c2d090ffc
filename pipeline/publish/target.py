"""Where a publish goes: TARGET (a libpq URL without a secret, or the embedded server) and
NAME (a table name that can only be an identifier).

A URL is read by libpq's own parser (psycopg.conninfo): a password (in the user part or as a
parameter), or any parameter libpq keeps secret, refuses it, and no message ever shows the URL
itself, only its host, port, database and user. `embedded` is DIR's own server, its data in
DIR/_postgres/ (pipeline/publish/embedded.py, which reaches either). A server at a URL is never reconfigured.
"""
from __future__ import annotations

import dataclasses
import functools
import logging
import re
from pathlib import Path
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pipeline.exits import UsageError
from pipeline.outdir import layout
from pipeline.outdir.view import is_local
from pipeline.publish.conninfo import nested, secrets_in

EMBEDDED = "embedded"
DEFAULT_TABLE = "embeddings"
PASSWORD_HELP = "give the password through PGPASSWORD, PGPASSFILE or ~/.pgpass (as psql does)"
SERVICE_HELP = ("give it in a connection service file (PGSERVICEFILE names it, ?service=NAME in the URL picks its "
                "section), which libpq reads on the launcher and on every worker")
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


def shown(params: dict[str, Any]) -> str:
    user = f"{params['user']}@" if params.get("user") else ""
    host = params.get("host") or ""
    port = f":{params['port']}" if params.get("port") else ""
    database = params.get("dbname") or ""
    if nested(database):   # a connection string libpq reads as its own: shown by no message
        database = "(a connection string)"
    if host.startswith("/"):   # a Unix socket's directory
        return f"postgresql://{user}{port and 'localhost' + port}/{database}?host={host}"
    return f"postgresql://{user}{host}{port}/{database}"


def parse_url(value: str, flag: str = "--to") -> Database:
    """A libpq URL, refused when it holds a password or another secret (nothing of it is echoed)."""
    if not value.startswith(("postgresql://", "postgres://")):
        raise UsageError(f"{flag}: expected `embedded` or a URL postgresql://[user@]host[:port]/database"
                         "[?param=value...]")
    try:
        params = conninfo_to_dict(value)
    except psycopg.ProgrammingError:
        raise UsageError(f"{flag}: not a URL libpq can read; expected postgresql://[user@]host[:port]/database"
                         "[?param=value...]") from None
    held = secrets_in(params, secret_parameters())
    if passwords := [where for where, key in held if key == "password"]:
        inside = f" in its {passwords[0]} parameter" if passwords[0] else ""
        raise UsageError(f"{flag}: the URL holds a password{inside}, which the command line must not carry (it "
                         f"shows in the process list and the shell's history): {PASSWORD_HELP}")
    if held:
        named = ", ".join(sorted({key + (f" (in its {where} parameter)" if where else "") for where, key in held}))
        raise UsageError(f"{flag}: the URL holds {named}, a secret the command line must not carry (it "
                         "shows in the process list and the shell's history, and would travel in the job to its "
                         f"workers): {SERVICE_HELP}")
    return Database(make_conninfo("", **params), shown(params))


@functools.cache
def secret_parameters() -> frozenset[str]:
    """libpq's parameters that carry a secret: those it shows only as `*` (password, sslpassword,
    oauth_client_secret in libpq 18), and the SCRAM keys, which authenticate as a password does
    (libpq lists them among its debug options)."""
    hidden = {o.keyword.decode() for o in pq.Conninfo.get_defaults() if o.dispchar == b"*"}
    return frozenset(hidden | {"scram_client_key", "scram_server_key"})


def embedded_data(output_dir: str, flag: str = "--to") -> Path:
    """DIR/_postgres/, the embedded database's data directory: on a local disk only. DIR's path
    resolved, not that of _postgres: a link there is followed only to a database
    (pipeline/publish/embedded.py)."""
    if not is_local(output_dir):
        raise UsageError(f"{flag} embedded keeps its database in DIR/{layout.POSTGRES}/, on a local disk; "
                         f"{output_dir} is not one: give a postgresql:// URL")
    return Path(output_dir).resolve() / layout.POSTGRES


def check_target(target: str, output_dir: str, flag: str = "--to") -> None:
    """TARGET refused (UsageError) before anything is read or connected when it cannot be one."""
    if target == EMBEDDED:
        embedded_data(output_dir, flag)
    else:
        parse_url(target, flag)

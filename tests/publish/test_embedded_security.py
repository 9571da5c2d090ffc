"""The embedded server and other local users: reachable by none of them whatever DIR's path, the
mode of no directory outside DIR/_postgres changed, no path read by a shell, no process in group
root. As root (the server runs as a user of its own, or as DIR's owner) and as a plain user (the
second user, publishing its own DIR)."""
from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import psycopg
import pytest
from psycopg.conninfo import make_conninfo

from pipeline.publish.embedded import psql_binary
from tests.e2e.money_helpers import REPO
from tests.publish.stops import until
from tests.second_user import run_as_second_user, second_user

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second local user")
# The second user runs the project on the venv's packages with an interpreter it can execute:
# the venv's python may link into a directory closed to it (/root/.pyenv).
BOOT = ("import runpy, site, sys; site.addsitedir(sys.argv.pop(1)); "
        "runpy.run_module('pipeline', run_name='__main__', alter_sys=True)")


@pytest.fixture
def base():
    """A directory others may pass (0711) but not list: the second user gets as far as DIR's
    own directories allow."""
    path = Path(tempfile.mkdtemp(prefix="embedpipe-test-sec-"))
    path.chmod(0o711)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def moved(day1: Path, to: Path) -> Path:
    to.parent.mkdir(parents=True, exist_ok=True)
    day1.rename(to)
    return to


def psql() -> str:
    return str(psql_binary())


def second_users_python() -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for found in (os.path.realpath(sys.executable), f"/usr/bin/{version}", f"/usr/local/bin/{version}"):
        with contextlib.suppress(OSError):
            if run_as_second_user([found, "-c", ""]).returncode == 0:
                return found
    pytest.skip(f"no {version} that the second user can run")


def command(*args: str, as_second: bool = False) -> list[str]:
    if as_second:
        return [second_users_python(), "-c", BOOT, sysconfig.get_paths()["purelib"], *args]
    return [sys.executable, "-m", "pipeline", *args]


def cli(*args: str, as_second: bool = False) -> subprocess.CompletedProcess:
    if as_second:
        return run_as_second_user(command(*args, as_second=True), timeout=300)
    return subprocess.run(command(*args), cwd=REPO, capture_output=True, text=True, timeout=300)


def as_second_user() -> dict:
    user = second_user()
    return {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": [], "cwd": "/",
            "env": {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}}


def give(path: Path, user: pwd.struct_passwd) -> None:
    for found in [path, *path.rglob("*")]:
        os.chown(found, user.pw_uid, user.pw_gid, follow_symlinks=False)


def the_second_users(day1: Path, base: Path, *inner: str) -> Path:
    """DAY1 moved to home/[INNER/]out, home a 0700 directory of the second user's, as all it holds."""
    home = base / "home"
    home.mkdir(mode=0o700)
    out = moved(day1, home.joinpath(*inner, "out"))
    give(home, second_user())
    return out


def modes_above(path: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_mode & 0o7777, p.stat().st_uid) for p in path.parents}


def postmaster(data: Path) -> tuple[int, Path, str]:
    """DATA/postmaster.pid's pid, socket directory and status."""
    lines = (data / "postmaster.pid").read_text().split("\n")
    return int(lines[0]), Path(lines[4]), lines[7].strip() if len(lines) > 7 else ""


def as_root(socket_dir: Path) -> str:
    return make_conninfo("", host=str(socket_dir), user="postgres", dbname="postgres")


def _sleeping(data: Path) -> tuple[int, Path] | None:
    try:
        pid, socket_dir, status = postmaster(data)
        if status != "ready":
            return None
        with psycopg.connect(as_root(socket_dir), autocommit=True) as conn:
            if conn.execute("SELECT 1 FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%'").fetchone():
                return pid, socket_dir
    except (OSError, ValueError, IndexError, psycopg.OperationalError):
        pass
    return None


@contextlib.contextmanager
def held(out: Path, as_second: bool = False) -> Iterator[tuple[int, Path]]:
    """OUT's server kept running by `psql OUT` (its session sleeping) while the block runs: the
    postmaster's pid and its socket's directory. The session is cancelled after: psql ends, and
    the server with it."""
    proc = subprocess.Popen(command("psql", str(out), "-c", "SELECT pg_sleep(3600)", as_second=as_second),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            **(as_second_user() if as_second else {"cwd": REPO}))
    try:
        found = until(lambda: _sleeping(out / "_postgres"), "psql's session", proc)
        yield found
    finally:
        with contextlib.suppress(OSError, ValueError, IndexError, psycopg.Error):
            with psycopg.connect(as_root(postmaster(out / "_postgres")[1]), autocommit=True) as conn:
                conn.execute("SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE 'SELECT pg_sleep%' "
                             "AND pid <> pg_backend_pid()")
        proc.communicate(timeout=120)


def credentials(pid: int) -> dict[str, list[int]]:
    """/proc/PID/status's Uid, Gid (real, effective, saved, filesystem) and Groups."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: [int(v) for v in rest.split()] for k, _, rest in (line.partition(":") for line in lines)
            if k in ("Uid", "Gid", "Groups")}


def server_credentials(pid: int) -> list[dict[str, list[int]]]:
    """Every process of the server of postmaster PID: its credentials (of those still there:
    a session's backend may end meanwhile)."""
    postmaster_ = psutil.Process(pid)
    seen = []
    for process in [postmaster_, *postmaster_.children(recursive=True)]:
        with contextlib.suppress(FileNotFoundError):
            seen.append(credentials(process.pid))
    return seen


def assert_runs_as(pid: int, user: pwd.struct_passwd) -> None:
    seen = server_credentials(pid)
    assert len(seen) > 3   # the postmaster, its checkpointer, writers...
    for c in seen:
        assert set(c["Uid"]) == {user.pw_uid} and set(c["Gid"]) == {user.pw_gid}, c
        assert c["Groups"] in ([], [user.pw_gid]), c
        assert 0 not in c["Gid"] + c["Groups"], c


def tried_by_second_user(socket_dir: Path, marker: Path) -> subprocess.CompletedProcess:
    """The second user's psql at SOCKET_DIR, asking the server to run a program that makes MARKER."""
    return run_as_second_user([psql(), as_root(socket_dir), "-c", "CREATE TEMP TABLE t (x text)",
                               "-c", f"COPY t FROM PROGRAM 'touch {marker}'"])


def test_as_root_the_server_runs_as_its_own_user_in_its_own_group_only(day1):
    assert cli("publish", str(day1), "--to", "embedded").returncode == 0
    with held(day1) as (pid, socket_dir):
        owner = pwd.getpwuid((day1 / "_postgres").stat().st_uid)
        assert owner.pw_uid != 0 and owner.pw_shell.endswith(("nologin", "false"))
        assert_runs_as(pid, owner)
        with psycopg.connect(as_root(socket_dir)) as conn:
            assert conn.execute("SHOW listen_addresses").fetchone() == ("",)   # no TCP listener


@pytest.mark.parametrize("long", [False, True], ids=["socket-in-data", "long-path"])
def test_no_other_user_can_connect_whatever_dirs_path(day1, base, long):
    """The second user's psql fails to connect (its socket's directory is closed to it), so it
    cannot have the server run a program either; a path too long for a socket in DIR/_postgres
    (100+ characters) gets a private directory of its own, gone with the server."""
    out = moved(day1, base / ("d" * 60) / ("e" * 40) / "out" if long else base / "out")
    assert (len(str(out)) >= 100) is long
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    marker = Path(f"/tmp/embedpipe-marker-{uuid.uuid4().hex}")
    with held(out) as (_, socket_dir):
        assert (socket_dir == out / "_postgres") is not long
        assert socket_dir.stat().st_mode & 0o077 == 0 and socket_dir.stat().st_uid != 0
        done = tried_by_second_user(socket_dir, marker)
        assert done.returncode != 0 and "Permission denied" in done.stderr, done.stderr
        assert "authentication" not in done.stderr
        assert not marker.exists()
    assert not socket_dir.exists() or socket_dir == out / "_postgres"
    searched = cli("search", str(out), "--like", "s-1")
    assert searched.returncode == 0, searched.stderr[-2000:]


def test_past_the_private_directory_peer_authentication_refuses_another_user(day1, base):
    """Were its socket reachable, the server would still not let the second user in: peer
    authentication of its own user and root, no `trust`."""
    out = moved(day1, base / ("d" * 100) / "out")
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    marker = Path(f"/tmp/embedpipe-marker-{uuid.uuid4().hex}")
    with held(out) as (_, socket_dir):
        assert socket_dir.parent == Path("/tmp")
        socket_dir.chmod(0o711)
        next(socket_dir.glob(".s.PGSQL.*[0-9]")).chmod(0o777)
        done = tried_by_second_user(socket_dir, marker)
        assert done.returncode != 0 and "authentication failed" in done.stderr, done.stderr
        assert not marker.exists()


def test_as_root_the_modes_above_dir_stay_and_a_closed_directory_is_one_line(day1, base):
    closed = base / "closed"
    closed.mkdir(mode=0o700)
    out = moved(day1, closed / "out")
    before = modes_above(out)
    done = cli("publish", str(out), "--to", "embedded")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"cannot pass {closed} (mode 700)" in done.stderr
    assert modes_above(out) == before and not (out / "_postgres").exists()
    chmod = done.stderr.split("let it pass (", 1)[1].split(")", 1)[0]
    subprocess.run(shlex.split(chmod), check=True)   # as the line says
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    assert modes_above(out) == {**before, closed: (0o701, 0)}


def test_as_root_a_dir_of_another_user_is_served_as_that_user_and_the_modes_above_stay(day1, base):
    out = the_second_users(day1, base)
    user = second_user()
    before = modes_above(out)
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    assert modes_above(out) == before
    assert (out / "_postgres").stat().st_uid == user.pw_uid
    with held(out) as (pid, _):
        assert_runs_as(pid, user)


def test_the_api_key_never_reaches_the_server_of_another_user(day1, base, monkeypatch):
    """Root publishes and reads a DIR of the second user's with the API key (and another secret)
    in its environment: the server, which runs as that user, holds neither."""
    out = the_second_users(day1, base)
    monkeypatch.setenv("SOME_TOKEN", "tok-not-for-the-server")
    seen = base / "seen"   # what each program run as that user is given (test(1), which asks what it can reach)
    seen.mkdir(mode=0o777)
    seen.chmod(0o777)
    (base / "bin").mkdir()
    (base / "bin" / "test").write_text(f'#!/bin/sh\n/usr/bin/env > "{seen}/$$"\nexec {shutil.which("test")} "$@"\n')
    (base / "bin" / "test").chmod(0o755)
    monkeypatch.setenv("PATH", f"{base / 'bin'}:{os.environ['PATH']}")
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    given = [p.read_text() for p in seen.iterdir()]
    assert given and not [g for g in given if os.environ["EMBEDDINGS_API_KEY"] in g or "tok-not" in g], given
    with held(out) as (pid, _):
        assert os.environ["EMBEDDINGS_API_KEY"]
        processes = [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
        read = [run_as_second_user(["cat", f"/proc/{p}/environ"]) for p in processes]
        assert any(r.returncode == 0 and "PATH=" in r.stdout for r in read)   # the second user reads them...
        for r in read:
            assert os.environ["EMBEDDINGS_API_KEY"] not in r.stdout and "tok-not-for-the-server" not in r.stdout


def test_a_plain_user_serves_its_own_dir_privately(day1, base):
    """The second user publishes its own DIR (a path too long for a socket in it): the modes above
    DIR stay, its server runs as it alone, its socket's directory is its own and closed."""
    out = the_second_users(day1, base, "d" * 100)
    user = second_user()
    before = modes_above(out)
    done = cli("publish", str(out), "--to", "embedded", as_second=True)
    assert done.returncode == 0, done.stderr[-3000:]
    assert modes_above(out) == before
    with held(out, as_second=True) as (pid, socket_dir):
        assert socket_dir.stat().st_uid == user.pw_uid and socket_dir.stat().st_mode & 0o077 == 0
        assert_runs_as(pid, user)
    ran = cli("psql", str(out), "-tA", "-c", "CREATE TEMP TABLE t (x text)", "-c", "COPY t FROM PROGRAM 'id -G'",
              "-c", "SELECT x FROM t", as_second=True)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split()[-1] == str(user.pw_gid)   # its own server: COPY runs as it, in its group only


def test_a_plain_user_publishing_a_dir_it_cannot_write_is_one_line(day1, base):
    out = moved(day1, base / "roots" / "out")   # root's, which the second user reads
    for path in (base / "roots", *out.rglob("*")):
        path.chmod(path.stat().st_mode | 0o555 if path.is_dir() else path.stat().st_mode | 0o444)
    done = cli("publish", str(out), "--to", "embedded", as_second=True)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"{out} is not yours to write" in done.stderr and not (out / "_postgres").exists()


def test_a_path_with_a_space_a_quote_and_a_command_is_read_by_no_shell(day1, base):
    marker = Path(f"/tmp/embedpipe-marker-{uuid.uuid4().hex}")
    out = moved(day1, base / f"a b'c\"d $(touch {marker})" / "out")
    done = cli("publish", str(out), "--to", "embedded")
    assert done.returncode == 0, done.stderr[-3000:]
    counted = cli("psql", str(out), "-tA", "-c", "SELECT count(*) > 0 FROM embeddings")
    assert counted.stdout.strip() == "t", counted.stderr
    assert not marker.exists()


def test_a_path_with_a_line_break_is_one_line_and_no_server_left(day1, base):
    """postmaster.pid names the data and socket directories one a line: a server started there
    would be found by no command, nor stopped."""
    out = moved(day1, base / "a\nb" / "out")
    for args in (["publish", str(out), "--to", "embedded"], ["psql", str(out), "-c", "SELECT 1"]):
        done = cli(*args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "holds a line break" in done.stderr
    assert not (out / "_postgres").exists()
    assert not [p for p in psutil.process_iter(["cmdline"]) if str(out) in " ".join(p.info["cmdline"] or [])]


def test_a_link_in_place_of_the_data_directory_never_makes_it_elsewhere(day1, base):
    """DIR's owner links DIR/_postgres to an empty directory of root's: root's publish refuses it
    in one line, and that directory stays root's, closed and empty."""
    out = the_second_users(day1, base)
    victim = base / "root-only"
    victim.mkdir(mode=0o700)
    (out / "_postgres").symlink_to(victim)
    done = cli("publish", str(out), "--to", "embedded")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "is a link to" in done.stderr
    assert victim.stat().st_uid == 0 and victim.stat().st_mode & 0o777 == 0o700 and not list(victim.iterdir())


def test_the_server_s_last_words_reach_root_s_terminal_without_control_characters(day1, base):
    """DIR's owner, who writes the configuration, puts terminal escapes in a setting's value: root's
    command, whose server does not start, says what it said in one line, without them."""
    out = the_second_users(day1, base)
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    with (out / "_postgres" / "postgresql.conf").open("a") as conf:
        conf.write("work_mem = '\x1b]0;title\x07\x1b[2J'\n")
    done = cli("psql", str(out), "-c", "SELECT 1")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "work_mem" in done.stderr and not [c for c in done.stderr.strip() if not c.isprintable()], done.stderr


@pytest.mark.parametrize("name", ["log", "postgresql.conf"])
def test_root_writes_nothing_through_a_link_in_the_data_directory(day1, base, name):
    """The server's user (here DIR's owner) replaces a file that root's command writes to with a
    link to a file of root's: the command refuses in one line, and root's file is unchanged."""
    out = the_second_users(day1, base)
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    victim = base / "root-only.txt"
    victim.write_text("root's\n")
    victim.chmod(0o600)
    (out / "_postgres" / name).unlink()
    (out / "_postgres" / name).symlink_to(victim)
    done = cli("publish", str(out), "--to", "embedded")
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "not a plain file of its own" in done.stderr and done.stderr.strip().endswith(str(out / "_postgres" / name))
    assert victim.read_text() == "root's\n"


@pytest.mark.parametrize("status", ["ready", "starting", "stopping"])
def test_a_stale_pid_file_whose_pid_another_process_has_is_passed_over(day1, base, status):
    """A server killed as it ran, started or stopped (a reboot), its pid the server's user's
    process since: the next command neither waits for that process nor is refused by
    PostgreSQL's own check of the pid; it starts DIR's server, and that process is untouched."""
    out = the_second_users(day1, base)
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    reused = subprocess.Popen(["sleep", "600"], **as_second_user())
    try:
        (out / "_postgres" / "postmaster.pid").write_text(f"{reused.pid}\n{out / '_postgres'}\n0\n5432\n"
                                                          f"{out / '_postgres'}\n\n0 0\n{status}\n")
        done = subprocess.run(command("psql", str(out), "-tA", "-c", "SELECT count(*) > 0 FROM embeddings"),
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0 and done.stdout.strip() == "t", done.stderr[-2000:]
        assert reused.poll() is None
    finally:
        reused.kill()
        reused.wait()


def test_a_pid_that_the_data_directory_names_is_never_signalled_as_root(day1, base):
    """The server's user (here DIR's owner) writes a postmaster.pid naming a process of root's (in
    DATA) and a socket that answers: root's command ends, that process untouched."""
    out = the_second_users(day1, base)
    user = second_user()
    home = out.parent
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    sockets = home / "sockets"   # the server's user's alone, as a socket directory of its server
    sockets.mkdir(mode=0o700)
    give(sockets, user)
    roots = subprocess.Popen(["sleep", "600"], cwd=out / "_postgres")   # working in DATA, as a postmaster does
    with socket.socket(socket.AF_UNIX) as answering:
        answering.bind(str(sockets / ".s.PGSQL.5432"))
        answering.listen(8)
        threading.Thread(target=lambda: [answering.accept()[0].close() for _ in range(8)], daemon=True).start()
        (out / "_postgres" / "postmaster.pid").write_text(f"{roots.pid}\n{out / '_postgres'}\n0\n5432\n{sockets}\n"
                                                          "\n0 0\nready   \n")
        try:
            done = cli("psql", str(out), "-c", "SELECT 1")
            assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr
            assert roots.poll() is None
        finally:
            roots.kill()
            roots.wait()


def test_a_stale_pid_file_never_leads_to_another_user_s_server(day1, base):
    """A server killed without its stop (then a reboot: the temporary directory emptied, its pid
    another process's) leaves a postmaster.pid naming a socket directory in /tmp: the second
    user makes that directory and serves a database of its own there. Root's publish starts
    DIR's own server, and the second user's database never sees the view."""
    user = second_user()
    out = moved(day1, base / ("d" * 100) / "out")
    assert cli("publish", str(out), "--to", "embedded").returncode == 0
    theirs, sockets = base / "theirs", Path(tempfile.gettempdir()) / f"embedpipe-pg-{uuid.uuid4().hex[:8]}"
    for made in (theirs, sockets):
        made.mkdir(mode=0o700)
        os.chown(made, user.pw_uid, user.pw_gid)
    programs = psql_binary().parent
    made = run_as_second_user([str(programs / "initdb"), "-D", str(theirs / "data"), "-U", "postgres", "--auth=trust"],
                              timeout=300)
    assert made.returncode == 0, made.stderr
    server = subprocess.Popen([str(programs / "postgres"), "-D", str(theirs / "data"), "-c", "listen_addresses=",
                               "-k", str(sockets)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              **as_second_user())
    reused = subprocess.Popen(["sleep", "600"])
    try:
        until(lambda: next(sockets.glob(".s.PGSQL.5432"), None), "the second user's server", server)
        (out / "_postgres" / "postmaster.pid").write_text(f"{reused.pid}\n{out / '_postgres'}\n0\n5432\n{sockets}\n\n"
                                                          "0 0\nready   \n")
        done = cli("publish", str(out), "--to", "embedded", "--table", "taken")
        assert done.returncode == 0, done.stderr[-3000:]
        theirs_read = run_as_second_user([psql(), as_root(sockets), "-tA", "-c", "SELECT to_regclass('taken') IS NULL"])
        assert theirs_read.stdout.strip() == "t", theirs_read.stderr
        counted = cli("psql", str(out), "-tA", "-c", "SELECT count(*) > 0 FROM taken")
        assert counted.stdout.strip() == "t", counted.stderr
    finally:
        reused.kill()
        reused.wait()
        server.terminate()
        server.wait(60)
        shutil.rmtree(sockets, ignore_errors=True)

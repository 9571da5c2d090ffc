"""publish on Prism (LOOPBACK, and EXTERNAL workers of a pool) as on the local runner: each side
publishes its DIR into a database of its own on one server, and the exit codes, the reports
and the tables read back (every column, the vectors as bytes) are the same. A pool's workers
reach the database by a URL without a password, with the one their environment gives them."""
from __future__ import annotations

import contextlib
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.e2e.helpers import corpus_rows, write_corpus
from tests.e2e.money_helpers import REPO
from tests.e2e.test_secrets import files_under, hits
from tests.postgres import url_of
from tests.prism.test_commands import _day2
from tests.prism.twin import Side, env_for
from tests.publish.helpers import assert_same, table_rows

MODEL = "text-embedding-3-small"


def new_database(pg_server) -> str:
    """A fresh database of the session's server, with pgvector."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    with psycopg.connect(url_of(pg_server, name), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
    return name


def drop_database(pg_server, name: str) -> None:
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture
def databases(pg_server) -> Iterator:
    """Call: a fresh database's URL (no password), dropped at teardown."""
    made: list[str] = []

    def make() -> str:
        made.append(new_database(pg_server))
        return url_of(pg_server, made[-1])

    yield make
    for name in made:
        drop_database(pg_server, name)


def published(side: Side) -> list[dict]:
    """The side's table, row by row, after checking it is the side's own view bit for bit."""
    url = side.values["db"]
    assert_same(side.out, url)
    return [row for _, row in sorted(table_rows(url).items())]


def test_publish_builds_applies_a_delta_and_writes_nothing_alike(both, tmp_path, databases):
    rows = corpus_rows()
    day1, day2 = write_corpus(tmp_path / "day1.parquet", rows), write_corpus(tmp_path / "day2.parquet", _day2(rows))
    workers = tmp_path / "workers.yaml"   # the delta's rows loaded on the runner's workers, not by the launcher
    workers.write_text("publish:\n  launcher_rows: 0\n")
    pair = both()
    for side in pair.sides:
        side.values["db"] = databases()
    common = ("--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    publish = ("publish", "{out}", "--to", "{db}", "--json")
    pair.cli("run", "--input", day1, *common)
    local, _ = pair.cli(*publish, extra=published)
    assert local.code == 0 and local.stdout["action"] == "built" and len(local.extra) == local.stdout["rows"] > 20
    pair.cli("run", "--input", day2, *common, "--sync")
    local, _ = pair.cli(*publish, "--run-config", str(workers), extra=published)
    assert local.code == 0 and local.stdout["action"] == "delta" and local.stdout["loaded_by"] == "workers"
    assert local.stdout["written"] == local.stdout["inserted"] + local.stdout["updated"] + local.stdout["deleted"] > 0
    local, _ = pair.cli(*publish, extra=published)
    assert local.code == 0 and local.stdout["action"] == "unchanged" and local.stdout["written"] == 0
    local, _ = pair.cli("publish", "{out}", "--to", "{db}", "--table", "x; drop table y")
    assert local.code == 2


@contextlib.contextmanager
def database_with_password(pg_server, password: str) -> Iterator[str]:
    """A fresh database's URL for a login role that the server lets in over its socket with
    PASSWORD only (scram: its pg_hba.conf line first); the role, the line and the database gone
    after."""
    role, name = f"pw_{uuid.uuid4().hex[:8]}", new_database(pg_server)
    hba = Path(pg_server.pgdata) / "pg_hba.conf"
    original = hba.read_text()
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password)))
    with psycopg.connect(url_of(pg_server, name), autocommit=True) as conn:
        conn.execute(sql.SQL("GRANT CREATE ON SCHEMA public TO {}").format(sql.Identifier(role)))
        hba.write_text(f"local all {role} scram-sha-256\n{original}")
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield url_of(pg_server, name, role)
    finally:
        hba.write_text(original)
        drop_database(pg_server, name)
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_pool_workers_take_the_password_from_their_environment(tmp_path, sandbox_factory, leak_key, own_pool,
                                                               wrapper, pg_server, monkeypatch):
    password = f"pw-LEAKCHECK-{uuid.uuid4().hex}"
    passfile = tmp_path / "pgpass"
    with database_with_password(pg_server, password) as url:
        passfile.write_text(f"*:*:*:*:{password}\n")
        passfile.chmod(0o600)
        assert password not in url
        corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows())
        outcomes = {}
        for name, worker_env in (("with", {"PGPASSFILE": str(passfile)}), ("without", {})):
            pool = own_pool(env_for(leak_key, **worker_env))   # the launcher has the password file either way
            side = Side(name, tmp_path / name, sandbox_factory(key=leak_key, balance=1000.0),
                        ["--profile", "prism-pool", "--prism_location", str(wrapper.path), "--environment_config",
                         pool.address], pool.launcher_env(env_for(leak_key, PGPASSFILE=str(passfile))),
                        lambda p=pool: {**wrapper.logs(), **p.logs()}, leak_key)
            assert side.cli("run", "--input", corpus, "--output", "{out}", "--model", MODEL, "--base-url",
                            "{base_url}").code == 0
            outcomes[name] = side.cli("publish", "{out}", "--to", url, "--table", f"t_{name}")
            blobs = {**wrapper.logs(), **pool.logs(), **files_under(side.out),
                     "output": (outcomes[name].raw_stderr + str(outcomes[name].stdout)).encode()}
            assert not hits(password, blobs), hits(password, blobs)
        assert outcomes["with"].code == 0, outcomes["with"].raw_stderr[-2000:]
        monkeypatch.setenv("PGPASSFILE", str(passfile))
        assert_same(tmp_path / "with" / "out", url, "t_with")
        failed = outcomes["without"]
        assert failed.code == 1 and "Traceback" not in failed.raw_stderr, failed.raw_stderr[-2000:]
        assert "a worker could not load rows" in failed.raw_stderr and "password" in failed.raw_stderr


def test_publish_on_prism_runs_the_binary_make_prism_built(tmp_path, sandbox_factory, pg_url, prism_binary,
                                                            monkeypatch):
    """`publish --profile prism` takes Prism from .cache/prism/ as `run --profile prism` does:
    without --prism_location, Beam would look for one in its own cache, then on GitHub."""
    from tests.e2e.money_helpers import SANDBOX_KEY, run, start_sandbox, write_models
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    out = tmp_path / "out"
    assert run(write_corpus(tmp_path / "corpus.parquet", corpus_rows()), out, start_sandbox(sandbox_factory, models),
               models) == 0
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", "--profile", "prism", str(out), "--to", pg_url],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert_same(out, pg_url)

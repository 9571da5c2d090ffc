"""Every bad input of a publish ends in one line and its exit code, with nothing changed: a
password on the command line (never echoed), a bad URL or table name (a hostile one runs no
SQL), a table that is not embedpipe's, a server that does not answer, a role without rights,
a server without pgvector, a second publisher of the same table."""
from __future__ import annotations

import subprocess
import sys

import psycopg
import pytest

from tests.e2e.money_helpers import REPO
from tests.postgres import url_of
from tests.publish.helpers import publish

SECRET = "s3cr3t-Pa55"


def cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300, **kwargs)


@pytest.mark.parametrize("url", [
    f"postgresql://postgres:{SECRET}@localhost/db", f"postgresql://postgres@localhost/db?password={SECRET}&sslmode=disable",
    f"postgresql://postgres@localhost/?%70assword={SECRET}",
    f"postgresql://postgres@localhost/db?dbname=postgresql://u:{SECRET}@h/d",   # libpq reads such a dbname as a URL
    f"postgresql://postgres@localhost/?dbname=postgresql%3A%2F%2Fu%3A{SECRET}%40h%2Fd",
    f"postgresql://postgres@localhost/?dbname=host%3Dh%20password%3D{SECRET}",
    f"postgresql://postgres@localhost/?application_name=postgresql%253A%252F%252Fu%253A{SECRET}%2540h"])
def test_a_password_in_the_url_is_refused_and_never_echoed(day1, url):
    for args in (["publish", str(day1), "--to", url],
                 ["run", "--input", "x.parquet", "--output", str(day1), "--model", "text-embedding-3-small",
                  "--base-url", "http://127.0.0.1:9/v1", "--sync", "--publish", url]):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert SECRET not in done.stderr + done.stdout
        assert len(done.stderr.strip().splitlines()) == 1
        assert all(w in done.stderr for w in ("PGPASSWORD", "PGPASSFILE", "~/.pgpass"))


def test_a_url_that_is_not_one_is_a_usage_error(day1, caplog):
    for url in ("mysql://localhost/db", "host=localhost dbname=x", "postgresql://localhost:5432/db?nosuch=1"):
        assert publish(day1, url) == 2, url


@pytest.mark.parametrize("name", ['x"; DROP TABLE canary; --', "canary;", "a.b.c", "1st", "Tab le", "",
                                  "x" * 64, "public.canary drop"])
def test_a_hostile_or_bad_table_name_runs_no_sql(day1, pg_url, name, caplog):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE canary (x int)")
    assert publish(day1, pg_url, "--table", name) == 2
    assert "not a table name" in caplog.text
    with psycopg.connect(pg_url) as conn:
        assert [r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")] == \
            ["canary"]


def made(url: str) -> tuple[list, list]:
    """The extensions and the tables and views of the database."""
    with psycopg.connect(url) as conn:
        return (conn.execute("SELECT extname FROM pg_extension WHERE extname <> 'plpgsql'").fetchall(),
                conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE "
                             "nspname = 'public' AND relkind IN ('r', 'u', 'v') ORDER BY 1").fetchall())


@pytest.mark.parametrize("kind", ["TABLE", "VIEW"])
def test_a_table_that_is_not_ours_is_never_touched(day1, pg_url, kind, caplog):
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE mine AS SELECT 1 AS x")
        if kind == "VIEW":
            conn.execute("CREATE VIEW embeddings AS SELECT * FROM mine")
        else:
            conn.execute("CREATE TABLE embeddings AS SELECT 1 AS x")
    before = made(pg_url)
    assert publish(day1, pg_url) == 2
    assert "is not a table embedpipe publishes" in caplog.text and "(nothing was changed)" in caplog.text
    assert made(pg_url) == before   # not even pgvector, nor the tables a publish shares
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT x FROM embeddings").fetchall() == [(1,)]


@pytest.mark.parametrize("name", ["vector", "halfvec", "mood"])
def test_a_table_named_as_a_type_is_refused_before_anything_is_made(day1, pg_url, name, caplog):
    """pgvector's types (made by this very publish in a new database) and the user's: a view's
    row type would take the name."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TYPE mood AS ENUM ('calm')")
    assert publish(day1, pg_url, "--table", name) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert errors == [f"public.{name} is the name of a type in schema public, which a view's row type cannot take: "
                      "give another --table (nothing was changed)"]
    assert made(pg_url) == ([], [])


def test_a_view_of_ours_replaced_by_the_user_is_theirs(day1, pg_url, caplog):
    assert publish(day1, pg_url) == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP VIEW embeddings")
        conn.execute("CREATE TABLE embeddings (x int)")
    assert publish(day1, pg_url) == 2
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM embeddings").fetchone() == (0,)


def test_a_server_that_does_not_answer_is_one_line(day1, caplog):
    assert publish(day1, "postgresql://postgres@127.0.0.1:9/db?connect_timeout=2") == 1
    assert "could not connect to the database at postgresql://postgres@127.0.0.1:9/db" in caplog.text


def test_a_role_without_rights_is_refused_and_changes_nothing(day1, pg_server, pg_url, caplog):
    database = pg_url.split("/")[3].split("?")[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE ROLE reader LOGIN")
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
    try:
        assert publish(day1, url_of(pg_server, database, user="reader")) == 1
        assert "role reader may not create tables in schema public" in caplog.text
        with psycopg.connect(pg_url) as conn:
            assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
    finally:
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            conn.execute("DROP ROLE reader")
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{database}"')   # for the fixture's teardown


def test_a_server_without_pgvector_is_one_line(day1, pg_without_vector, caplog):
    assert publish(day1, url_of(pg_without_vector, "postgres")) == 1
    assert "pgvector is not installed on the server" in caplog.text


def test_nothing_to_publish_and_embedded_on_an_object_store_are_usage_errors(tmp_path, caplog):
    assert publish(tmp_path / "empty", "embedded") == 2
    assert "has no view to publish" in caplog.text
    assert publish("s3://bucket/out", "embedded") == 2   # nothing read from the store first
    assert "on a local disk" in caplog.text


def test_a_dir_on_this_disk_is_refused_for_workers_that_run_elsewhere(day1, caplog):
    """DIR's files are read by the workers: on a runner whose workers are on other hosts, a local
    DIR is refused as a local --output is, before anything is read or connected."""
    assert publish(day1, "postgresql://postgres@127.0.0.1:9/db", "--profile", "dataflow", "--region",
                   "us-central1") == 2
    errors = [r for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and errors[0].getMessage().startswith(f"DIR {day1} is on this machine's disk")


@pytest.mark.parametrize("param", ["sslpassword", "oauth_client_secret", "scram_client_key"])
def test_every_secret_parameter_of_libpq_is_refused_and_never_echoed(day1, param):
    """Not only the password: any parameter libpq keeps secret would reach the job's graph (the
    workers' connection) and its options."""
    url = f"postgresql://postgres@localhost/db?sslmode=disable&{param}={SECRET}"
    for args in (["publish", str(day1), "--to", url], ["search", str(day1), "--like", "s-1", "--to", url],
                 ["run", "--input", "x.parquet", "--output", str(day1), "--model", "text-embedding-3-small",
                  "--base-url", "http://127.0.0.1:9/v1", "--sync", "--publish", url]):
        done = cli(*args)
        assert done.returncode == 2, done.stderr
        assert SECRET not in done.stderr + done.stdout and len(done.stderr.strip().splitlines()) == 1
        assert f"the URL holds {param}" in done.stderr and "PGSERVICEFILE" in done.stderr

"""The rights a publish needs: CREATE on the schema and nothing more on the database (no TEMP),
and, on what is already there, the rights on the shared tables and the ownership of NAME and
its data table, each checked before anything is written."""
from __future__ import annotations

import contextlib
import uuid

import psycopg
from psycopg import sql

from tests.e2e.money_helpers import corpus_rows
from tests.e2e.test_sync import next_day
from tests.postgres import url_of
from tests.publish.helpers import assert_same, publish
from tests.publish.stops import data_tables


def database_of(url: str) -> str:
    return url.split("/")[3].split("?")[0]


@contextlib.contextmanager
def role(pg_server, url: str, *statements: str):
    """A login role of its own (ROLE in STATEMENTS, run as the superuser in URL's database), and
    URL as it; dropped after with what it owns there."""
    name = f"r_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        for statement in statements:
            conn.execute(statement.replace("ROLE", name))
    try:
        yield url_of(pg_server, database_of(url), user=name)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_role_without_temp_on_the_database_publishes_deltas_that_delete_rows(days, pg_server, pg_url):
    database = database_of(pg_url)
    with role(pg_server, pg_url, "GRANT CREATE ON SCHEMA public TO ROLE", f'REVOKE TEMP ON DATABASE "{database}" '
              "FROM PUBLIC", "CREATE EXTENSION vector") as url:
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT has_database_privilege(current_database(), 'TEMP')").fetchone() == (False,)
        rows = corpus_rows(n_short=40, n_long=2)
        assert days(rows) == 0
        assert publish(days.out, url) == 0
        assert days(next_day(rows, edit_short=3, edit_long=1, remove=2, add=3)[0], "--sync") == 0
        assert publish(days.out, url) == 0   # a delta that deletes the keys that left
        assert_same(days.out, url)


def test_a_role_lacking_a_right_on_what_another_role_made_is_refused_before_anything_is_made(
        days, pg_server, pg_url, caplog):
    rows = corpus_rows(n_short=30, n_long=1)
    assert days(rows) == 0
    assert publish(days.out, pg_url) == 0   # as postgres: the shared tables and NAME are its
    assert days(next_day(rows, edit_short=3, edit_long=0, remove=1, add=2)[0], "--sync") == 0
    tables = data_tables(pg_url)
    with role(pg_server, pg_url, "GRANT CREATE ON SCHEMA public TO ROLE") as url:
        caplog.clear()
        assert publish(days.out, url, "--table", "theirs") == 1
        assert ("lacks rights this publish needs in postgresql://r_" in caplog.text and "SELECT, INSERT, UPDATE, "
                "DELETE on public.embedpipe_published; SELECT, INSERT, UPDATE, DELETE on public.embedpipe_loads; "
                "grant them to it, or publish as a role that has them (nothing was changed)" in caplog.text)

        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON embedpipe_published, embedpipe_loads TO {}")
                         .format(sql.Identifier(url.split("//")[1].split("@")[0])))
        caplog.clear()
        assert publish(days.out, url, "--table", "embeddings", "--run-config", _rebuild(days.out)) == 1
        assert "ownership of public.embeddings (owned by postgres); ownership of public.embedpipe_data_" in caplog.text
        assert data_tables(pg_url) == tables   # nothing built

        assert publish(days.out, url, "--table", "theirs") == 0
        assert_same(days.out, url, "theirs")


def _rebuild(out) -> str:
    """A run config whose every publish builds anew."""
    config = out.parent / "rebuild.yaml"
    config.write_text("publish:\n  rebuild_share: 0\n")
    return str(config)


def test_a_role_that_may_not_read_the_sessions_is_refused_before_anything_is_made(day1, pg_server, pg_url, caplog):
    """The swap waits for the sessions whose snapshot predates its rows (pg_stat_activity): a
    database that hides them is refused first, not after a build."""
    with role(pg_server, pg_url, "GRANT CREATE ON SCHEMA public TO ROLE", "CREATE EXTENSION vector",
              "REVOKE SELECT ON pg_catalog.pg_stat_activity FROM PUBLIC") as url:
        caplog.clear()
        assert publish(day1, url) == 1
        assert "SELECT on pg_catalog.pg_stat_activity" in caplog.text and "(nothing was changed)" in caplog.text
        assert data_tables(pg_url) == []

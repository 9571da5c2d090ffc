"""A publish killed (SIGKILL) at any step, whose connection drops, or whose server restarts,
leaves the table as it was; the same command then completes and leaves nothing of the killed
one behind. A table edited by hand is repaired by the next publish, rewriting only the buckets
that differ; a served view that DIR no longer keeps is diffed against the table.

A publish is stopped at a step from the database's side (tests/publish/stops.py): a session
of the test holds a lock the publish needs there, until the publish is seen waiting for it."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from pipeline.publish.checks import shared_tables
from pipeline.publish.target import Database
from tests.e2e.money_helpers import corpus_rows
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, publish, published
from tests.publish.reader import snapshot
from tests.publish.stops import data_tables, holding, publish_waits_on, queued, served_table, start


def tables(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {r[0] for r in conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = "
                                           "c.relnamespace WHERE nspname = 'public' AND relkind IN ('r', 'v', 'u')")}


def state(url: str):
    with psycopg.connect(url) as conn:
        return snapshot(conn) if "embeddings" in tables(url) else None


def leftovers(url: str) -> list[str]:
    return [t for t in tables(url) if t.startswith("embedpipe_staging_")]


@contextlib.contextmanager
def stopped_build(out, url: str, step: str, *extra: str) -> Iterator[subprocess.Popen]:
    """A first publish of OUT stopped at STEP: `loaded` (every row in the new table, its key's
    index about to be built), `indexed` (every index built, ANALYZE next), `swap` (in the swap's
    transaction, NAME made, the record about to be saved)."""
    with psycopg.connect(url, autocommit=True) as conn:   # the tables a lock is held on
        shared_tables(conn, Database(url, "test"), "public", 10)
    if step == "swap":
        with holding(url, "LOCK TABLE embedpipe_published IN SHARE MODE"):
            proc = start(out, url, *extra)
            publish_waits_on(url, proc, "embedpipe_published")
            yield proc
        return
    with holding(url, "LOCK TABLE embedpipe_loads IN SHARE MODE") as gate:
        proc = start(out, url, *extra)
        publish_waits_on(url, proc, "embedpipe_loads")   # a worker, marking its first task
        data = data_tables(url)[-1]
        with holding(url, f"LOCK TABLE {data} IN ROW EXCLUSIVE MODE") as rows_in:   # the load goes on
            gate.rollback()
            publish_waits_on(url, proc, data, "ShareLock")   # every task loaded: the key's index
            if step == "loaded":
                yield proc
                return
            with queued(url, f"LOCK TABLE {data} IN SHARE MODE"):   # granted with the index builds' locks
                rows_in.rollback()
                publish_waits_on(url, proc, data, "ShareUpdateExclusiveLock")   # ANALYZE
                with psycopg.connect(url) as conn:
                    assert conn.execute("SELECT count(*) FROM pg_indexes WHERE tablename = %s",
                                        (data,)).fetchone() == (4,)   # the key's, chunk_id's, GIN, HNSW
                yield proc


@contextlib.contextmanager
def stopped_delta(out, url: str, step: str) -> Iterator[tuple[subprocess.Popen, int]]:
    """A delta's publish of OUT stopped at STEP: `loaded` (its rows staged, the apply's
    transaction at its first change of the served table), `apply` (every change made in it, the
    record about to be saved). The publish, and its server process that waits."""
    relation = served_table(url) if step == "loaded" else "embedpipe_published"
    with holding(url, f"LOCK TABLE {relation} IN SHARE MODE"):
        proc = start(out, url)
        yield proc, publish_waits_on(url, proc, relation)


@pytest.mark.parametrize("step", ["loaded", "indexed", "swap"])
def test_a_first_publish_killed_at_any_step_leaves_nothing_served_and_completes_again(days, pg_url, tmp_path, step):
    assert days(corpus_rows(n_short=30, n_long=1)) == 0
    config = tmp_path / "pipeline.yaml"   # the swap waits for the lock, rather than trying again
    config.write_text("publish:\n  lock_timeout_ms: 600000\n")
    with stopped_build(days.out, pg_url, step, "--run-config", str(config)) as proc:
        proc.kill()
        proc.wait(30)
    assert state(pg_url) is None
    assert publish(days.out, pg_url) == 0
    assert_same(days.out, pg_url)
    assert len(data_tables(pg_url)) == 1 and not leftovers(pg_url)


def _day2(days, url: str):
    """A DIR published, then a --sync day that changes a few documents: the table's state."""
    rows = corpus_rows(n_short=40, n_long=2)
    assert days(rows) == 0
    assert publish(days.out, url) == 0
    assert days(next_day(rows, edit_short=3, edit_long=1, remove=2, add=3)[0], "--sync") == 0
    return state(url)


@pytest.mark.parametrize("step", ["loaded", "apply"])
def test_a_delta_killed_at_any_step_leaves_the_table_as_it_was(days, pg_url, step):
    before = _day2(days, pg_url)
    with stopped_delta(days.out, pg_url, step) as (proc, _):
        proc.kill()
        proc.wait(30)
    assert state(pg_url) == before
    assert publish(days.out, pg_url) == 0
    assert_same(days.out, pg_url)
    assert not leftovers(pg_url)


def test_a_dropped_connection_is_one_line_and_the_next_publish_completes(days, pg_url):
    before = _day2(days, pg_url)
    with stopped_delta(days.out, pg_url, "apply") as (proc, pid):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            killed = conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = %s AND "
                                  "application_name = 'embedpipe publish'", (pid,)).fetchall()
        assert killed == [(True,)]
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1, err
    assert "was lost" in err and "Traceback" not in err
    assert state(pg_url) == before
    assert publish(days.out, pg_url) == 0
    assert_same(days.out, pg_url)


def test_a_table_edited_by_hand_is_repaired_by_the_next_publish(days, pg_url, capsys):
    assert days(corpus_rows(n_short=60, n_long=2)) == 0
    assert publish(days.out, pg_url) == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        data = conn.execute("SELECT data_table FROM (SELECT record->>'data_table' AS data_table FROM "
                            "embedpipe_published) r").fetchone()[0]
        for statement in ("UPDATE {t} SET embedding = embedding + embedding WHERE doc_id = 's-1'",
                          "UPDATE {t} SET cost_rub = 0 WHERE doc_id = 's-2'",
                          "DELETE FROM {t} WHERE doc_id = 's-3'",
                          "INSERT INTO {t} (doc_id, chunk_index, chunk_count, token_start, token_end, n_tokens, "
                          "text_sha256, text, model, embedding, request_id, cost_rub, run_id, embedded_at) SELECT "
                          "'intruder', chunk_index, chunk_count, token_start, token_end, n_tokens, text_sha256, text, "
                          "model, embedding, request_id, cost_rub, run_id, embedded_at FROM {t} WHERE doc_id = 's-4'",
                          "UPDATE {t} SET text = 'edited' WHERE doc_id = 's-5'"):
            conn.execute(sql.SQL(statement).format(t=sql.Identifier(data)))
    repaired = published(capsys, days.out, pg_url)
    assert repaired["action"] == "delta" and 1 <= repaired["drifted_buckets"] <= 5
    assert repaired["written"] < 60
    assert_same(days.out, pg_url)
    assert published(capsys, days.out, pg_url)["action"] == "unchanged"


def test_a_name_redefined_by_hand_over_the_data_table_is_defined_again(days, pg_url, capsys, caplog):
    """NAME still reads the data table, so it is embedpipe's, but serves other rows than the
    view: the next publish defines it again (with the user's grants, and refused while the
    user's objects depend on a NAME it must make anew)."""
    assert days(corpus_rows(n_short=30, n_long=1)) == 0
    assert publish(days.out, pg_url) == 0
    data = served_table(pg_url)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        served = conn.execute("SELECT pg_get_viewdef('embeddings')").fetchone()[0].rstrip().rstrip(";")
        conn.execute(sql.SQL("CREATE OR REPLACE VIEW embeddings AS {} WHERE doc_id <> 's-1'").format(sql.SQL(served)))
    caplog.clear()
    again = published(capsys, days.out, pg_url)
    assert again["action"] == "redefined" and again["written"] == 0
    assert "is defined otherwise than a publish defines it" in caplog.text
    rows = assert_same(days.out, pg_url)
    assert published(capsys, days.out, pg_url)["action"] == "unchanged"

    with psycopg.connect(pg_url, autocommit=True) as conn:   # made anew by hand, a column fewer
        conn.execute("DROP VIEW embeddings")
        conn.execute(sql.SQL("CREATE VIEW embeddings AS SELECT doc_id, chunk_index, embedding FROM {}")
                     .format(sql.Identifier(data)))
        conn.execute("GRANT SELECT ON embeddings TO PUBLIC")
        conn.execute("CREATE VIEW mine AS SELECT doc_id FROM embeddings")
    caplog.clear()
    assert publish(days.out, pg_url) == 2
    assert "its column embedding changes from vector(32) to vector" in caplog.text and "view mine" in caplog.text
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP VIEW mine")
    assert published(capsys, days.out, pg_url)["action"] == "redefined"
    assert assert_same(days.out, pg_url) == rows
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT has_table_privilege('public', 'embeddings', 'SELECT')").fetchone() == (True,)


def test_a_served_view_no_longer_kept_is_diffed_against_the_table(days, pg_url, tmp_path, capsys):
    rows = corpus_rows(n_short=60, n_long=2)
    config = tmp_path / "pipeline.yaml"
    config.write_text("views:\n  keep: 1\n")
    assert days(rows, "--run-config", str(config)) == 0
    assert publish(days.out, pg_url) == 0
    served = json.loads((days.out / "_current.json").read_text())["view"]
    for seed in (1, 2):
        rows, _ = next_day(rows, seed=seed, edit_short=2, edit_long=0, remove=1, add=2)
        assert days(rows, "--sync", "--run-config", str(config)) == 0
    assert not (days.out / "_views" / f"{served}.json").exists()
    result = published(capsys, days.out, pg_url)
    assert result["action"] == "delta" and result["written"] <= 12
    assert_same(days.out, pg_url)


def test_a_server_restarted_mid_publish_leaves_the_table_as_it_was(days, pg_url, pg_server):
    before = _day2(days, pg_url)
    with stopped_delta(days.out, pg_url, "loaded") as (proc, _):
        pg_server.restart()
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in err, err
    assert state(pg_url) == before
    assert publish(days.out, pg_url) == 0
    assert_same(days.out, pg_url)
    assert not leftovers(pg_url)


@pytest.mark.parametrize("launcher_rows", [10_000, 0])   # the delta's rows loaded by the launcher, or the workers
def test_a_full_disk_on_the_server_is_one_line_and_the_table_stays(days, pg_server, pg_url, reachable_tmp, caplog,
                                                                   tmp_path, launcher_rows):
    """The database's tables on a tablespace of a small tmpfs (root mounts one), filled."""
    from tests.conftest import fill
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"publish:\n  launcher_rows: {launcher_rows}\n")
    disk = reachable_tmp / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"a tmpfs cannot be mounted here ({mounted.stderr.strip()}): needs root or CAP_SYS_ADMIN")
    try:
        (disk / "pg").mkdir()
        os.chown(disk / "pg", pg_server.account.uid, pg_server.account.gid)
        database = pg_url.split("/")[3].split("?")[0]
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f"CREATE TABLESPACE small_{database} LOCATION '{disk / 'pg'}'")
            conn.execute(f'ALTER DATABASE "{database}" SET default_tablespace = small_{database}')
        rows = corpus_rows(n_short=40, n_long=2)
        assert days(rows) == 0
        assert publish(days.out, pg_url) == 0
        before = state(pg_url)
        assert days(next_day(rows, edit_short=10, edit_long=2, remove=2, add=20)[0], "--sync") == 0
        filler = fill(disk, 8192)
        assert publish(days.out, pg_url, "--run-config", str(config)) == 1
        assert "disk is full" in caplog.text and "serves what it did before" in caplog.text
        assert state(pg_url) == before
        filler.unlink()
        assert publish(days.out, pg_url) == 0
        assert_same(days.out, pg_url)
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:   # the tablespace must be empty to go
            conn.execute(f'ALTER DATABASE "{database}" RESET default_tablespace')
            for (table,) in conn.execute("SELECT relname FROM pg_class c JOIN pg_tablespace t ON t.oid = "
                                         "c.reltablespace WHERE t.spcname = %s AND c.relkind IN ('r', 'u')",
                                         (f"small_{database}",)).fetchall():
                conn.execute(f'DROP TABLE IF EXISTS "{table}" CASCADE')
        with psycopg.connect(pg_url.replace(f"/{database}?", "/postgres?"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')
            conn.execute(f"DROP TABLESPACE small_{database}")
            conn.execute(f'CREATE DATABASE "{database}"')   # for the fixture's teardown
        subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.parametrize("option, said", [
    ("lock_timeout", "canceling statement due to lock timeout (SQLSTATE 55P03); it serves what it did before: "
                     "publish again"),
    ("statement_timeout", "a statement ran longer than the server's statement_timeout: canceling statement due to "
                          "statement timeout (SQLSTATE 57014); it serves what it did before: raise it for the role "
                          "that publishes (ALTER ROLE ... SET statement_timeout), then publish again")])
def test_a_database_error_is_told_as_the_server_said_it(day1, pg_url, option, said, caplog):
    """The session's own limit (here the URL's `options`, which the workers' sessions take too)
    cuts a worker's statement that waits for a lock held meanwhile: one line with what the
    server said, not a lost connection."""
    with psycopg.connect(pg_url, autocommit=True) as conn:   # the table a lock is held on
        shared_tables(conn, Database(pg_url, "test"), "public", 10)
    url = f"{pg_url}&options=-c%20{option}%3D300"
    with holding(pg_url, "LOCK TABLE embedpipe_loads IN ACCESS EXCLUSIVE MODE"):
        caplog.clear()
        assert publish(day1, url) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR" and r.name == "embedpipe"]
    assert errors == [f"publishing to public.embeddings failed: {said}"]
    assert state(pg_url) is None
    assert publish(day1, pg_url) == 0

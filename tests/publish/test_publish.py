"""publish: the table serves DIR's current view exactly, bit for bit, by URL and embedded."""
from __future__ import annotations

import json
import subprocess
import sys

import psutil
import psycopg
from psycopg import sql

from pipeline.cli import main
from tests.e2e.money_helpers import REPO
from tests.postgres import url_of
from tests.publish.helpers import assert_same, publish


def test_first_publish_serves_the_view_bit_for_bit(day1, pg_url, capsys):
    assert publish(day1, pg_url, "--json") == 0
    report = json.loads(capsys.readouterr().out)
    rows = assert_same(day1, pg_url)
    assert report["rows"] == report["inserted"] == rows and report["failed"] == 1
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET enable_seqscan = off")   # a few dozen rows: a scan would be cheaper
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN SELECT doc_id FROM embeddings ORDER BY embedding <=> (SELECT embedding FROM embeddings LIMIT 1) "
            "LIMIT 5"))
        assert "hnsw" in plan
    assert publish(day1, pg_url, "--json") == 0   # nothing changed: nothing written
    again = json.loads(capsys.readouterr().out)
    assert again["action"] == "unchanged" and again["written"] == 0


def _postgres_of(path) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["name", "cmdline"])
            if p.info["name"] == "postgres" and str(path) in " ".join(p.info["cmdline"] or [])]


def test_embedded_is_started_for_the_command_and_stopped(day1):
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(day1), "--to", "embedded", "--table",
                           "corpus.chunks"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "schema corpus does not exist" in done.stderr
    done = subprocess.run([sys.executable, "-m", "pipeline", "publish", str(day1), "--to", "embedded"], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "to public.embeddings at embedded" in done.stdout
    assert not _postgres_of(day1 / "_postgres")
    shown = subprocess.run([sys.executable, "-m", "pipeline", "psql", str(day1), "-tA", "-c",
                            "SELECT '[1]'::vector", "-c", "SHOW hnsw.ef_search"], cwd=REPO, capture_output=True,
                           text=True, timeout=300)
    assert shown.stdout.split() == ["[1]", "100"], shown.stderr   # publish.ef_search: psql searches as `search` does
    assert not _postgres_of(day1 / "_postgres")


def test_the_server_puts_each_key_in_the_bucket_the_launcher_computes(day1, pg_url):
    from transforms.publish.columns import bucket_of
    assert publish(day1, pg_url) == 0
    with psycopg.connect(pg_url) as conn:
        data = conn.execute("SELECT record->>'data_table' FROM embedpipe_published").fetchone()[0]
        rows = conn.execute(sql.SQL("SELECT doc_id, chunk_index, token_start, _ep_bucket FROM {}")
                            .format(sql.Identifier(data))).fetchall()
    assert rows and all(bucket_of(d, c, t) == b for d, c, t, b in rows)


def test_beams_options_before_dir_keep_their_values(day1, pg_url, caplog):
    """`publish --profile local DIR`: a flag's value is never read as DIR."""
    assert main(["publish", "--profile", "local", "--direct_num_workers", "1", str(day1), "--to", pg_url]) == 0
    assert_same(day1, pg_url)
    assert main(["publish", str(day1), "--to", pg_url, "--direct_num_worker", "2"]) == 2
    assert "--direct_num_worker (did you mean --direct_num_workers?)" in caplog.text


def _ef_search(url: str) -> str:
    """In a new session, as psql opens one, once pgvector is loaded (a vector read)."""
    with psycopg.connect(url) as conn:
        conn.execute("SELECT '[1]'::vector")
        return conn.execute("SHOW hnsw.ef_search").fetchone()[0]


def test_the_publishing_roles_sessions_search_with_the_configured_ef_search(day1, pg_server, pg_url, tmp_path):
    """publish.ef_search becomes the publishing role's default in the table's database (ALTER
    ROLE ... IN DATABASE ... SET), for any role: other roles keep theirs."""
    config = tmp_path / "pipeline.yaml"
    config.write_text("publish:\n  ef_search: 77\n")
    database = pg_url.split("/")[3].split("?")[0]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector")
        conn.execute("CREATE ROLE searcher LOGIN")
        conn.execute("CREATE SCHEMA theirs AUTHORIZATION searcher")
    as_searcher = url_of(pg_server, database, user="searcher")
    try:
        assert _ef_search(pg_url) == _ef_search(as_searcher) == "40"   # pgvector's own default
        assert publish(day1, pg_url, "--run-config", str(config)) == 0
        assert _ef_search(pg_url) == "77" and _ef_search(as_searcher) == "40"
        assert publish(day1, as_searcher, "--run-config", str(config), "--table", "theirs.embeddings") == 0
        assert _ef_search(as_searcher) == "77"
        assert publish(day1, pg_url) == 0   # the configuration's value, whatever the role had
        assert _ef_search(pg_url) == "100"
    finally:
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(database)))
            conn.execute("DROP ROLE searcher")
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database)))   # for the fixture's teardown

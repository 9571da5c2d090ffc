"""NAME's passage: `text` (the view's, bit for bit), `chunk_id` (the key in one text, the same
in every run, unique) and `text_tsv` (the text's tsvector in publish.text_search_config, with
a GIN index that a query on NAME uses)."""
from __future__ import annotations

import psycopg

from tests.e2e.money_helpers import corpus_rows
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, publish, published, view_rows

NAME_COLUMNS = ["doc_id", "chunk_index", "chunk_count", "token_start", "token_end", "n_tokens", "text_sha256", "model",
                "embedding", "request_id", "cost_rub", "run_id", "embedded_at", "text", "chunk_id", "text_tsv"]


def plan(conn: psycopg.Connection, statement: str, params=()) -> str:
    conn.execute("SET enable_seqscan = off")   # a few dozen rows: a scan would be cheaper
    try:
        return "\n".join(r[0] for r in conn.execute(f"EXPLAIN {statement}", params))
    finally:
        conn.execute("RESET enable_seqscan")


def chunk_ids(url: str) -> dict[tuple, str]:
    with psycopg.connect(url) as conn:
        return {(d, c, t): i for d, c, t, i in conn.execute(
            "SELECT doc_id, chunk_index, token_start, chunk_id FROM embeddings")}


def test_name_shows_the_text_its_chunk_id_and_tsvector_each_indexed(day1, pg_url, capsys):
    report = published(capsys, day1, pg_url)
    assert report["text_search"] == "simple" and report["without_text"] == 0
    rows = assert_same(day1, pg_url)   # the text among every column of the view
    with psycopg.connect(pg_url) as conn:
        columns = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'embeddings'::regclass "
                                              "AND attnum > 0 ORDER BY attnum")]
        assert columns == NAME_COLUMNS
        assert conn.execute("SELECT count(*), count(DISTINCT chunk_id), count(*) FILTER (WHERE chunk_id = doc_id || "
                            "':' || chunk_index || ':' || token_start), count(*) FILTER (WHERE text_tsv = "
                            "to_tsvector('simple', text)), count(*) FILTER (WHERE text = '') FROM embeddings"
                            ).fetchone() == (rows, rows, rows, rows, 0)
        doc, text = conn.execute("SELECT doc_id, text FROM embeddings WHERE doc_id = 's-7'").fetchone()
        word = max(text.split(), key=len).strip(".,")
        query = "SELECT doc_id FROM embeddings WHERE text_tsv @@ websearch_to_tsquery('simple', %s)"
        assert doc in {r[0] for r in conn.execute(query, (word,))}
        assert "_tsv" in plan(conn, query, (word,))   # the GIN index, through NAME
        chunk = "SELECT doc_id FROM embeddings WHERE chunk_id = %s"
        assert conn.execute(chunk, ("s-7:0:0",)).fetchall() == [("s-7",)]
        assert "_chunk" in plan(conn, chunk, ("s-7:0:0",))
        unique = conn.execute("SELECT i.indisunique FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
                              "AND a.attnum = ANY(i.indkey) WHERE i.indrelid = (SELECT (record->>'data_table')::regclass "
                              "FROM embedpipe_published) AND a.attname = 'chunk_id'").fetchall()
        assert unique == [(True,)]


def test_chunk_id_is_the_same_for_the_same_chunk_in_every_run(days, pg_url, capsys):
    rows = corpus_rows(n_short=40, n_long=2)
    assert days(rows) == 0
    assert publish(days.out, pg_url) == 0
    first = chunk_ids(pg_url)
    assert days(next_day(rows, edit_short=3, edit_long=1, remove=2, add=3)[0], "--sync") == 0
    assert published(capsys, days.out, pg_url)["action"] == "delta"
    second = chunk_ids(pg_url)
    assert second.keys() == view_rows(days.out).keys() and first.keys() & second.keys()
    assert all(first[k] == second[k] for k in first.keys() & second.keys())
    assert all(i == f"{d}:{c}:{t}" for (d, c, t), i in second.items()) and len(set(second.values())) == len(second)
    assert_same(days.out, pg_url)

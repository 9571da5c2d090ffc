"""The user's own objects on the published table: views, materialized views, functions, rules,
triggers, grants and foreign keys. A delta, and a build that keeps NAME's columns (CREATE OR
REPLACE VIEW: a switch to any model, of any length, the vector's type the same), keep those on
NAME, which then read the new rows; a build that makes NAME anew (a column that goes) or
replaces the data table they read is refused before anything is built, naming them, and the
table stays as it was."""
from __future__ import annotations

import psycopg
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from psycopg import sql

from tests.e2e.money_helpers import MODEL, corpus_rows, start_sandbox, write_corpus
from tests.e2e.test_switch import OTHER, THIRD, run, write_models
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, publish
from tests.publish.reader import snapshot


@pytest.fixture
def switching(tmp_path, sandbox_factory, env_key):
    """run(model, *flags) on one corpus, DIR and sandbox; THIRD of MODEL's length (32), OTHER longer (48)."""
    models = write_models(tmp_path / "models.yaml")
    doc = yaml.safe_load(models.read_text())
    doc["models"][THIRD]["dimensions"] = doc["models"][MODEL]["dimensions"]
    models.write_text(yaml.safe_dump(doc))
    sandbox, corpus, out = start_sandbox(sandbox_factory, models), tmp_path / "corpus.parquet", tmp_path / "out"

    def day(model: str, rows, *flags: str) -> int:
        write_corpus(corpus, rows)
        return run(corpus, out, sandbox, models, model, *flags)
    day.out = out
    day.run = lambda corpus, other, model, *flags: run(corpus, other, sandbox, models, model, *flags)
    return day


def execute(url: str, *statements: str | sql.Composed) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)


def rows(url: str, query: str) -> list[tuple]:
    with psycopg.connect(url) as conn:
        return sorted(conn.execute(query).fetchall())


def database_state(url: str) -> tuple:
    """What NAME serves, its record, and every table and view of the schema."""
    with psycopg.connect(url) as conn:
        record = conn.execute("SELECT record - 'published_at', bucket_hashes FROM embedpipe_published").fetchall()
        relations = conn.execute("SELECT relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                                 "WHERE nspname = 'public' AND relkind IN ('r', 'u', 'v', 'm') ORDER BY 1").fetchall()
        return snapshot(conn), record, relations


OF_NAME = (
    "CREATE VIEW mine AS SELECT doc_id, chunk_index, model, embedding FROM embeddings",
    "CREATE MATERIALIZED VIEW counted AS SELECT model, count(*) AS n FROM embeddings GROUP BY model",
    "CREATE FUNCTION chunks_of(d text) RETURNS bigint LANGUAGE sql BEGIN ATOMIC "
    "SELECT count(*) FROM embeddings WHERE doc_id = d; END",
    "CREATE TABLE asked (doc_id text)",
    "CREATE RULE no_writes AS ON INSERT TO embeddings DO INSTEAD NOTHING",
)


def test_a_delta_and_a_same_length_switch_keep_the_users_objects_reading_the_new_rows(switching, pg_url):
    day = corpus_rows(n_short=30, n_long=1)
    assert switching(MODEL, day) == 0
    assert publish(switching.out, pg_url) == 0
    execute(pg_url, *OF_NAME, "CREATE ROLE reader_k", "GRANT SELECT ON embeddings TO reader_k")
    try:
        day, _ = next_day(day, edit_short=2, edit_long=0, remove=1, add=2)
        assert switching(MODEL, day, "--sync") == 0
        assert publish(switching.out, pg_url) == 0   # a delta: in place
        mine = "SELECT doc_id, chunk_index, model, embedding::text FROM mine"
        assert rows(pg_url, mine) == rows(pg_url, "SELECT doc_id, chunk_index, model, embedding::text FROM embeddings")
        assert ("new-7-0", 0, MODEL) in {r[:3] for r in rows(pg_url, mine)}

        assert switching(THIRD, day, "--sync", "--switch-model") == 0
        assert publish(switching.out, pg_url) == 0   # a build of another model, of the same columns: swapped in
        assert_same(switching.out, pg_url)
        assert {r[2] for r in rows(pg_url, mine)} == {THIRD}
        assert rows(pg_url, mine) == rows(pg_url, "SELECT doc_id, chunk_index, model, embedding::text FROM embeddings")
        assert rows(pg_url, "SELECT chunks_of('l-0')") == rows(pg_url, "SELECT count(*) FROM embeddings WHERE "
                                                                       "doc_id = 'l-0'")
        execute(pg_url, "REFRESH MATERIALIZED VIEW counted")   # a materialized view reads at its refresh
        assert rows(pg_url, "SELECT model, n FROM counted") == rows(pg_url, "SELECT model, count(*) FROM embeddings "
                                                                            "GROUP BY model")
        assert rows(pg_url, "SELECT rulename FROM pg_rules WHERE tablename = 'embeddings'") == [("no_writes",)]
        assert rows(pg_url, "SELECT has_table_privilege('reader_k', 'embeddings', 'SELECT')") == [(True,)]
    finally:
        execute(pg_url, "DROP OWNED BY reader_k", "DROP ROLE reader_k")


def test_a_switch_to_another_length_keeps_the_users_objects_and_a_column_that_goes_is_refused(switching, pg_url,
                                                                                             tmp_path, caplog):
    day = corpus_rows(n_short=30, n_long=1)
    assert switching(MODEL, day) == 0
    assert publish(switching.out, pg_url) == 0
    execute(pg_url, *OF_NAME, "CREATE ROLE reader_o", "GRANT SELECT ON embeddings TO reader_o")
    try:
        assert switching(OTHER, day, "--sync", "--switch-model") == 0
        assert publish(switching.out, pg_url) == 0   # 32 dimensions to 48: NAME's embedding is `vector` for both
        assert_same(switching.out, pg_url)
        assert rows(pg_url, "SELECT DISTINCT model, vector_dims(embedding) FROM mine") == [(OTHER, 48)]
        assert rows(pg_url, "SELECT chunks_of('l-0')") == rows(pg_url, "SELECT count(*) FROM embeddings WHERE "
                                                                       "doc_id = 'l-0'")
        assert rows(pg_url, "SELECT rulename FROM pg_rules WHERE tablename = 'embeddings'") == [("no_writes",)]

        kept = tmp_path / "kept"   # another DIR, whose view keeps a column: NAME gains it after its own
        corpus = tmp_path / "kept.parquet"
        pq.write_table(pa.table({"id": [r["id"] for r in day], "text": [r["text"] for r in day],
                                 "lang": ["en"] * len(day)}), corpus)
        assert switching.run(corpus, kept, OTHER, "--keep-columns", "lang") == 0
        assert publish(kept, pg_url) == 0
        assert_same(kept, pg_url)
        assert rows(pg_url, "SELECT DISTINCT model FROM mine") == [(OTHER,)]

        before = database_state(pg_url)   # the first DIR again: its view has no `lang`
        caplog.clear()
        assert publish(switching.out, pg_url) == 2
        said = caplog.text
        for name in ("view mine", "materialized view counted", "function chunks_of(text)",
                     "rule no_writes on view embeddings", "its column lang goes", "drop them"):
            assert name in said, name
        assert database_state(pg_url) == before   # nothing built, staged or dropped

        execute(pg_url, "DROP VIEW mine", "DROP MATERIALIZED VIEW counted", "DROP FUNCTION chunks_of",
                "DROP RULE no_writes ON embeddings")
        assert publish(switching.out, pg_url) == 0
        assert_same(switching.out, pg_url)
        assert rows(pg_url, "SELECT has_table_privilege('reader_o', 'embeddings', 'SELECT')") == [(True,)]
    finally:
        execute(pg_url, "DROP OWNED BY reader_o", "DROP ROLE reader_o")


def test_a_rebuild_is_refused_while_objects_of_the_user_read_the_data_table_and_a_delta_is_not(switching, pg_url, tmp_path, caplog):
    day = corpus_rows(n_short=30, n_long=1)
    assert switching(MODEL, day) == 0
    assert publish(switching.out, pg_url) == 0
    data = rows(pg_url, "SELECT record->>'data_table' FROM embedpipe_published")[0][0]
    execute(pg_url, *(sql.SQL(s).format(t=sql.Identifier(data)) for s in (
        "CREATE VIEW raw AS SELECT doc_id, chunk_index FROM {t}",
        "CREATE TABLE notes (doc_id text, chunk_index int, token_start int, FOREIGN KEY (doc_id, chunk_index, "
        "token_start) REFERENCES {t} (doc_id, chunk_index, token_start))",
        "INSERT INTO notes SELECT doc_id, chunk_index, token_start FROM {t} WHERE doc_id = 'l-0'")))
    day, _ = next_day(day, edit_short=2, edit_long=0, remove=1, add=2)
    assert switching(MODEL, day, "--sync") == 0
    rebuild = tmp_path / "rebuild.yaml"
    rebuild.write_text("publish:\n  rebuild_share: 0\n")
    before = database_state(pg_url)
    caplog.clear()
    assert publish(switching.out, pg_url, "--run-config", str(rebuild)) == 2
    for name in ("view raw", "constraint notes_doc_id_chunk_index_token_start_fkey on table notes",
                 f"data table public.{data}", "make them read public.embeddings"):
        assert name in caplog.text, name
    assert database_state(pg_url) == before

    assert publish(switching.out, pg_url) == 0   # a delta updates that table in place: they stay valid
    assert_same(switching.out, pg_url)
    assert rows(pg_url, "SELECT * FROM raw") == rows(pg_url, "SELECT doc_id, chunk_index FROM embeddings")

    assert switching(MODEL, [r for r in day if r["id"] != "l-0"], "--sync") == 0   # the rows notes refers to go
    before = database_state(pg_url)
    caplog.clear()
    assert publish(switching.out, pg_url) == 2
    assert "notes_doc_id_chunk_index_token_start_fkey" in caplog.text and "nothing was changed" in caplog.text
    assert database_state(pg_url) == before and not [t for (t,) in before[2] if t.startswith("embedpipe_staging_")]

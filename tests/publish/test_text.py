"""NAME's passage: `text` (the view's, bit for bit), `chunk_id` (the key in one text, the same
in every run, unique) and `text_tsv` (the text's tsvector in publish.text_search_config, with
a GIN index that a query on NAME uses)."""
from __future__ import annotations

import json

import psycopg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import summary
from tests.e2e.test_sync import next_day
from tests.e2e.test_text import MODEL, before_text
from tests.e2e.money_helpers import corpus_rows
from tests.postgres import url_of
from tests.publish.helpers import assert_same, publish, published, table_rows, tuples_written, view_rows

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


def test_a_row_whose_lineage_alone_changed_is_updated_without_its_text(days, pg_url, capsys, tmp_path):
    """Long documents with one paragraph edited: their other chunks keep text and vector, with
    this run's id and cost 0. Their update leaves `text` out of its SET (a trigger `UPDATE OF
    text` fires for the others only), so text_tsv is not computed again, and is HOT where the
    page has room: no entry in the GIN, HNSW or key indexes."""
    config = tmp_path / "pipeline.yaml"
    config.write_text("publish:\n  fillfactor: 50\n")
    rows = corpus_rows(n_short=30, n_long=3)
    assert days(rows) == 0
    assert published(capsys, days.out, pg_url, "--run-config", str(config))["action"] == "built"
    before = view_rows(days.out)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        data = conn.execute("SELECT record->>'data_table' FROM embedpipe_published").fetchone()[0]
        conn.execute("CREATE TABLE texts_set (doc_id text, chunk_index integer, token_start integer)")
        conn.execute("CREATE FUNCTION log_text() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO texts_set "
                     "VALUES (NEW.doc_id, NEW.chunk_index, NEW.token_start); RETURN NEW; END $$")
        conn.execute(f'CREATE TRIGGER text_set AFTER UPDATE OF text ON "{data}" FOR EACH ROW EXECUTE FUNCTION '
                     "log_text()")
        hot_before = conn.execute("SELECT n_tup_hot_upd FROM pg_stat_user_tables WHERE relname = %s",
                                  (data,)).fetchone()[0]
    assert days(next_day(rows, edit_short=0, edit_long=2, remove=0, add=0)[0], "--sync") == 0
    report = published(capsys, days.out, pg_url, "--run-config", str(config))
    after = view_rows(days.out)
    assert_same(days.out, pg_url)
    changed = [k for k in after if k in before and before[k] != after[k]]
    lineage = [k for k in changed if (before[k]["text"], before[k]["embedding"]) == (after[k]["text"],
                                                                                     after[k]["embedding"])]
    assert lineage and all(after[k]["cost_rub"] == 0 and after[k]["run_id"] != before[k]["run_id"] for k in lineage)
    assert report["action"] == "delta" and report["updated"] == len(changed)
    assert report["inserted"] == len(after.keys() - before.keys())
    with psycopg.connect(pg_url) as conn:
        texts_set = {tuple(r) for r in conn.execute("SELECT * FROM texts_set")}
        hot = tuples_written(pg_url)["hot"] - hot_before
    assert texts_set == set(changed) - set(lineage)
    assert hot == len(lineage)


def tsv_mismatches(url: str, config: str) -> int:
    with psycopg.connect(url) as conn:
        return conn.execute("SELECT count(*) FROM embeddings WHERE text_tsv <> to_tsvector(%s::regconfig, text)",
                            (config,)).fetchone()[0]


def test_another_text_search_configuration_builds_the_column_again(day1, pg_url, capsys, tmp_path):
    english = tmp_path / "english.yaml"
    english.write_text("publish:\n  text_search_config: English\n")   # a name as PostgreSQL reads it
    assert published(capsys, day1, pg_url)["text_search"] == "simple"
    assert tsv_mismatches(pg_url, "simple") == 0
    report = published(capsys, day1, pg_url, "--run-config", str(english))
    assert report["action"] == "rebuilt" and report["text_search"] == "english"
    assert tsv_mismatches(pg_url, "english") == 0 and tsv_mismatches(pg_url, "simple") > 0
    assert_same(day1, pg_url)
    assert published(capsys, day1, pg_url, "--run-config", str(english))["action"] == "unchanged"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT record->>'text_search' FROM embedpipe_published").fetchone() == ("english",)


@pytest.mark.parametrize("config", ["klingon", "pg_catalog.nope", "a.b.c", "1", "'; DROP TABLE x; --"])
def test_a_configuration_the_server_lacks_is_refused_before_anything_is_made(day1, pg_url, capsys, caplog, tmp_path,
                                                                             config):
    settings = tmp_path / "pipeline.yaml"
    settings.write_text(f"publish:\n  text_search_config: {json.dumps(config)}\n")
    assert publish(day1, pg_url, "--run-config", str(settings)) == 2
    refusals = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(refusals) == 1 and "\n" not in refusals[0], refusals
    assert f"publish.text_search_config {config!r} is not a text search configuration" in refusals[0]
    assert "simple" in refusals[0] and "english" in refusals[0]   # what the server has
    with psycopg.connect(pg_url) as conn:   # nothing made: not even pgvector or the shared tables
        assert conn.execute("SELECT count(*) FROM pg_class WHERE relnamespace = 'public'::regnamespace").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM pg_extension WHERE extname = 'vector'").fetchone() == (0,)


SCRIPTS = {
    "ru": "Данные идут в вектор, бюджет ограничивает запрос. Ёжик в тумане. " * 12,
    "zh": "向量数据库保存每个段落的文本。搜索时显示段落，而不是重新读取语料库" * 10,   # no space at all
    "emoji": "Weather 🌦️ then 🌈, a family 👨‍👩‍👧‍👦 on a walk; " * 12,
    "ja": "検索は段落を示す" * 30,
    "mixed": "\n\n".join(f"Paragraph {i}. Данные {i}! 数据{i}。 🙂 end." for i in range(20)),
}


def test_passages_of_any_script_are_published_bit_for_bit_and_found(days, pg_url, capsys, tmp_path):
    """Every row's first word (as its tsvector has it) finds the row; a Cyrillic word is
    found whatever its case (the database's case mapping is Unicode's); in `russian`, by its
    stem. CJK runs are one word each: PostgreSQL's parser does not segment them."""
    assert days([{"id": d, "text": t} for d, t in SCRIPTS.items()], "--chunk-tokens", "40") == 0
    assert published(capsys, days.out, pg_url)["action"] == "built"
    assert assert_same(days.out, pg_url) > len(SCRIPTS) * 3
    find = "SELECT chunk_id FROM embeddings WHERE text_tsv @@ websearch_to_tsquery(%s, %s)"
    with psycopg.connect(pg_url) as conn:
        firsts = conn.execute("SELECT chunk_id, text, (SELECT lexeme FROM unnest(text_tsv) ORDER BY positions[1] "
                              "LIMIT 1) FROM embeddings").fetchall()
        assert all(word or not text.strip() for _, text, word in firsts)   # a chunk of a trailing space has none
        for chunk, _, word in firsts:
            assert word is None or chunk in {r[0] for r in conn.execute(find, ("simple", word))}, (chunk, word)
        found = {r[0].split(":")[0] for r in conn.execute(find, ("simple", "ДАННЫЕ"))}
        assert found == {"ru", "mixed"}
        assert {r[0].split(":")[0] for r in conn.execute(find, ("simple", "🌈"))} == {"emoji"}
    russian = tmp_path / "russian.yaml"
    russian.write_text("publish:\n  text_search_config: russian\n")
    assert published(capsys, days.out, pg_url, "--run-config", str(russian))["action"] == "rebuilt"
    with psycopg.connect(pg_url) as conn:   # another form of the word: its stem
        assert {r[0].split(":")[0] for r in conn.execute(find, ("russian", "данных ёжики"))} == {"ru"}


def data_tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        return [r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relkind = 'r' AND relname LIKE "
                                           "'embedpipe_data_%'")]


def test_a_nul_in_a_text_is_refused_naming_its_document(days, pg_url, capsys, caplog):
    """PostgreSQL's text holds no NUL, which a Parquet text may: refused in one line naming the
    document, before anything is written (exit 2), at a build and in a delta; not mapped,
    since NAME's text is the view's, whose sha256 is text_sha256."""
    rows = corpus_rows(n_short=10, n_long=0)
    nul = {"id": "with-nul", "text": "before\x00after, a NUL in the middle"}
    assert days([*rows, nul]) == 0
    assert any(r["doc_id"] == "with-nul" and "\x00" in r["text"] for r in view_rows(days.out).values())

    def refused() -> None:
        caplog.clear()
        assert publish(days.out, pg_url) == 2
        errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
        assert len(errors) == 1 and "\n" not in errors[0]
        assert "the chunk's text holds a NUL character (document 'with-nul')" in errors[0], errors
    refused()
    assert data_tables(pg_url) == []
    assert days(rows, "--sync") == 0
    assert publish(days.out, pg_url) == 0
    served = table_rows(pg_url)
    assert days([*rows, nul], "--sync") == 0
    refused()
    assert table_rows(pg_url) == served and len(data_tables(pg_url)) == 1


def test_rows_without_their_text_are_published_empty_and_counted(tmp_path, sandbox_factory, env_key, pg_url, capsys):
    """A DIR written before rows carried their text (tests/e2e/data/): its rows are published
    with an empty text, and the publish says how many; the runs that give them their text make
    deltas that write those rows, until none lacks it."""
    out, corpus, models, _ = before_text(tmp_path)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--models", str(models)])
    capsys.readouterr()
    assert publish(out, pg_url) == 0
    shown = capsys.readouterr().out
    rows = assert_same(out, pg_url)
    assert f"{rows:,} of the view's {rows:,} rows have no text" in shown
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FILTER (WHERE text = '' AND text_tsv = ''::tsvector) "
                            "FROM embeddings").fetchone() == (rows,)
    table, part = pq.read_table(corpus), tmp_path / "part.parquet"
    pq.write_table(table.filter(pc.is_in(table.column("id"), value_set=pa.array(["en-long", "short"]))), part)
    assert main(["run", "--input", str(part), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--resume", "--keep-columns", "lang"]) == 0
    lacking = summary(out)["current"]["without_text"]
    config = tmp_path / "pipeline.yaml"   # a delta, however large a share of the rows it writes
    config.write_text("publish:\n  rebuild_share: 1.0\n")
    report = published(capsys, out, pg_url, "--run-config", str(config))
    assert report["action"] == "delta" and report["without_text"] == lacking > 0
    assert report["updated"] == rows - lacking and report["inserted"] == report["deleted"] == 0
    assert_same(out, pg_url)
    assert main(["run", "--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--sync", "--keep-columns", "lang"]) == 0
    assert published(capsys, out, pg_url)["without_text"] == 0
    assert_same(out, pg_url)
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM embeddings WHERE text = ''").fetchone() == (0,)
        assert tsv_mismatches(pg_url, "simple") == 0


def test_a_view_without_the_text_column_publishes_it_empty(days, pg_url, capsys):
    """`--no-chunk-text`: NAME keeps its columns (a search, a retriever, a prepared statement
    read the same NAME whatever the view holds), the text empty, text_tsv empty."""
    assert days(corpus_rows(n_short=12, n_long=1), "--no-chunk-text") == 0
    report = published(capsys, days.out, pg_url)
    assert report["without_text"] == report["rows"] == assert_same(days.out, pg_url)
    with psycopg.connect(pg_url) as conn:
        columns = [r[0] for r in conn.execute("SELECT attname FROM pg_attribute WHERE attrelid = 'embeddings'::regclass "
                                              "AND attnum > 0 ORDER BY attnum")]
        assert columns == NAME_COLUMNS
        assert conn.execute("SELECT count(*) FROM embeddings WHERE text <> '' OR text_tsv <> ''::tsvector"
                            ).fetchone() == (0,)


def test_a_database_that_lower_cases_ascii_only_is_told(day1, pg_server, pg_url, caplog):
    """A database of the C locale (libc) lower-cases no Cyrillic letter: its text search tells
    Данные from данные. The publish says so in one line, and what makes one that does not."""
    database = "c_locale_" + pg_url.split("/")[3].split("?")[0]
    with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{database}" LOCALE_PROVIDER libc LOCALE \'C\' TEMPLATE template0')
    try:
        assert publish(day1, url_of(pg_server, database)) == 0
        told = [r.getMessage() for r in caplog.records if "lower-cases ASCII letters only" in r.getMessage()]
        assert len(told) == 1 and "BUILTIN_LOCALE 'C.UTF-8'" in told[0]
        caplog.clear()
        assert publish(day1, pg_url) == 0   # the test server's databases: made as the embedded one is
        assert "lower-cases" not in caplog.text
    finally:
        with psycopg.connect(url_of(pg_server, "postgres"), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE "{database}" WITH (FORCE)')


def test_every_document_with_a_nul_is_named_at_once_and_the_run_warned(days, pg_url, tmp_path, caplog):
    """NULs in texts, an id and a kept string of several documents: the run says so in one line
    before it pays (count and the first ids), and publish refuses naming every column and how
    many documents, not the first document only (one fix of the input, not one a publish)."""
    rows = corpus_rows(n_short=10, n_long=0)[:-1]
    rows += [{"id": f"nul-{i}", "text": f"text {i} with a \x00 inside"} for i in range(5)]
    rows.append({"id": "id\x00nul", "text": "a fine text of a document whose id is not"})
    data = {"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
            "note": ["kept \x00 nul" if r["id"] == rows[0]["id"] else "fine" for r in rows]}
    pq.write_table(pa.table(data), tmp_path / "nul.parquet")
    caplog.clear()
    assert days.run_file(tmp_path / "nul.parquet", "--keep-columns", "note") == 0
    warned = [r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "NUL" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    assert f"7 documents, the first: {rows[0]['id']!r}, 'nul-0', 'nul-1'" in warned[0], warned
    assert "`publish` will refuse them" in warned[0]

    caplog.clear()
    assert publish(days.out, pg_url) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    assert "the chunk's text holds a NUL character (5 documents, the first: 'nul-0', 'nul-1', 'nul-2')" in errors[0]
    assert "the document id holds a NUL character (document 'id\\x00nul')" in errors[0], errors
    assert f"kept column note holds a NUL character (document {rows[0]['id']!r})" in errors[0], errors
    assert data_tables(pg_url) == []

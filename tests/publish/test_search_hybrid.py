"""search's hybrid, vector and text modes on a published table of passages: the fused ranking is
the one computed by hand from the two legs; each hit shows its passage and the kept columns,
whatever their names; `--mode text` sends nothing; a query with no searchable word is a clear
result; passages in any script come back whole; vectors above 2,000 and 4,000 dimensions fuse
the same way."""
from __future__ import annotations

import logging

import pytest

from pipeline.cli import main
from tests.publish.helpers import publish, view_rows
from tests.publish.searching import (CJK, EMOJI, KEPT, fused, legs, published_passages, query_vector, ranking,
                                     search_json)

QUERY = "budget ledger"


def test_hybrid_is_the_fusion_of_the_two_legs_by_hand(days, pg_url, capsys, tmp_path):
    published_passages(days, pg_url)
    report = search_json(capsys, days, pg_url, QUERY, "-k", "15")
    by_vector, by_text = legs(pg_url, QUERY, query_vector(QUERY, 32))
    assert len(by_text) >= 15 and set(by_vector) != set(by_text)   # both legs count, and differ
    assert report["mode"] == "hybrid" and report["rrf_k"] == 60
    assert ranking(report) == fused(by_vector, by_text, 15)
    for hit in report["results"]:
        legs_score = sum(1 / (60 + r) for r in (hit["vector_rank"], hit["text_rank"]) if r is not None)
        assert hit["score"] == round(legs_score, 6)
    # the fusion's k and the legs' depth are settings; a chunk one leg found alone is ranked too
    config = tmp_path / "run.yaml"
    config.write_text("search:\n  rrf_k: 20\n  leg_rows: 8\n")
    shallow = search_json(capsys, days, pg_url, QUERY, "-k", "16", "--run-config", str(config))
    by_vector, by_text = legs(pg_url, QUERY, query_vector(QUERY, 32), depth=16)
    assert ranking(shallow) == fused(by_vector, by_text, 16, rrf_k=20) and shallow["rrf_k"] == 20
    alone = {(r["vector_rank"] is None, r["text_rank"] is None) for r in shallow["results"]}
    assert alone == {(False, False), (True, False), (False, True)}, alone
    vector = search_json(capsys, days, pg_url, QUERY, "--mode", "vector", "-k", "15")
    assert [r["chunk_id"] for r in vector["results"]] == by_vector[:15]
    assert [r["vector_rank"] for r in vector["results"]] == list(range(1, 16))
    text = search_json(capsys, days, pg_url, QUERY, "--mode", "text", "-k", "15")
    assert [r["chunk_id"] for r in text["results"]] == by_text[:15]
    assert all(r["vector_rank"] is None and r["text_score"] > 0 for r in text["results"])


def test_each_hit_shows_its_passage_chunk_id_and_kept_columns_whatever_their_names(days, pg_url, capsys):
    published_passages(days, pg_url)
    view = {(r["doc_id"], r["chunk_index"]): r for r in view_rows(days.out).values()}
    report = search_json(capsys, days, pg_url, QUERY, "-k", "5")
    assert len(report["results"]) == 5 and report["request"]["cost_rub"] > 0
    for hit in report["results"]:
        row = view[(hit["doc_id"], hit["chunk_index"])]
        assert hit["text"] == row["text"] and hit["chunk_id"]
        assert hit["token_start"] == row["token_start"] and hit["token_end"] == row["token_end"]
        # kept columns named as the search's own fields keep their own values
        assert set(hit["kept"]) == set(KEPT)
        assert hit["kept"]["similarity"] == row["similarity"] and hit["kept"]["score"] == row["score"]
        assert hit["kept"]["day"] == str(row["day"]) and hit["kept"]["lang"] == row["lang"]
        assert {"score", "vector_rank", "vector_score", "text_rank", "text_score"} <= hit.keys()
    capsys.readouterr()
    assert main(["search", str(days.out), QUERY, "-k", "3", "--to", pg_url, "--base-url", days.base_url,
                 "--models-config", str(days.models)]) == 0
    printed = capsys.readouterr().out
    first = report["results"][0]
    assert f"{first['doc_id']}#{first['chunk_index']}" in printed and "similarity=" in printed
    assert first["text"].split()[0] in printed   # the passage, shortened, under its hit


def test_text_mode_sends_nothing_and_needs_no_service(days, pg_url, capsys):
    published_passages(days, pg_url)
    charges, history = len(days.sandbox_ledger()), sorted((days.out / "history").iterdir())
    capsys.readouterr()
    assert main(["search", str(days.out), QUERY, "--mode", "text", "--to", pg_url, "--json",
                 "--base-url", "http://127.0.0.1:9/v1"]) == 0   # nothing listens there: never asked
    assert len(days.sandbox_ledger()) == charges and sorted((days.out / "history").iterdir()) == history
    assert main(["search", str(days.out), "ledger", "--mode", "text", "--to", pg_url]) == 0
    assert len(days.sandbox_ledger()) == charges


def test_a_query_with_no_searchable_word_is_a_clear_result(days, pg_url, capsys, caplog):
    published_passages(days, pg_url)
    caplog.set_level(logging.WARNING)
    report = search_json(capsys, days, pg_url, "!!! ... ???", "--mode", "text")
    assert report["results"] == [] and len(report["notes"]) == 1
    assert "no word of the query is left to search the text for" in caplog.text
    hybrid = search_json(capsys, days, pg_url, "?! ... -- ?!", "-k", "5")
    assert len(hybrid["results"]) == 5 and all(r["text_rank"] is None for r in hybrid["results"])
    assert "the vector leg's ranking alone" in hybrid["notes"][0]


def test_passages_in_any_script_come_back_whole(days, pg_url, capsys):
    rows = published_passages(days, pg_url)
    text = {r["id"]: r["text"] for r in rows}
    russian = next(r for r in rows if r["lang"] == "ru")
    word = russian["text"].split()[1].strip(".")
    found = search_json(capsys, days, pg_url, word, "--mode", "text", "-k", "50")
    assert found["results"] and all(word in r["text"].lower() for r in found["results"])
    assert all(r["text"] == text[r["doc_id"]] for r in found["results"])
    for query, doc in (("数据库", "zh-1"), ("ракета", "emoji-1"), ("rocket family", "emoji-1")):
        hits = search_json(capsys, days, pg_url, query, "-k", "3")["results"]
        assert hits[0]["doc_id"] == doc and hits[0]["text"] == text[doc], (query, hits[0])
    assert text["zh-1"] == CJK and text["emoji-1"] == EMOJI
    capsys.readouterr()
    assert main(["search", str(days.out), "ракета", "--mode", "text", "--to", pg_url]) == 0
    assert "ракета" in capsys.readouterr().out


@pytest.mark.parametrize("days", [3072, 4096], indirect=True)
def test_hybrid_above_2000_and_4000_dimensions(days, pg_url, capsys):
    published_passages(days, pg_url)
    dims = len(next(iter(view_rows(days.out).values()))["embedding"]) // 4
    assert dims in (3072, 4096)
    report = search_json(capsys, days, pg_url, QUERY, "-k", "10")
    assert ranking(report) == fused(*legs(pg_url, QUERY, query_vector(QUERY, dims)), 10)


def test_rows_without_text_show_empty_and_are_counted_once(days, pg_url, capsys, caplog):
    from tests.publish.searching import passages, write_passages
    corpus = write_passages(days.out.parent / "bare.parquet", passages(20))
    assert days.run_file(corpus, "--no-chunk-text") == 0
    assert publish(days.out, pg_url) == 0
    caplog.set_level(logging.WARNING)
    report = search_json(capsys, days, pg_url, "--like", "p-3", "-k", "4")
    assert [r["text"] for r in report["results"]] == [""] * 4
    rows = len(view_rows(days.out))
    assert report["rows_without_text"] == rows
    lines = [r.getMessage() for r in caplog.records if "have no text" in r.getMessage()]
    assert len(lines) == 1 and f"{rows:,} of public.embeddings's rows have no text" in lines[0]


@pytest.mark.parametrize("options", ["-c default_transaction_isolation=serializable",
                                     "-c default_transaction_isolation=repeatable\\ read",
                                     "-c default_transaction_read_only=on"])
def test_every_isolation_level_and_a_read_only_session_search_alike(days, pg_url, capsys, monkeypatch, options):
    """A reader's session as a standby's or a strict application's: the same hits, nothing written."""
    published_passages(days, pg_url)
    want = ranking(search_json(capsys, days, pg_url, QUERY, "--where", "lang=en"))
    with monkeypatch.context() as env:   # undone before the database is dropped
        env.setenv("PGOPTIONS", options)
        assert ranking(search_json(capsys, days, pg_url, QUERY, "--where", "lang=en")) == want
        assert ranking(search_json(capsys, days, pg_url, "--like", "p-3", "--where", "lang=en"))


def test_each_leg_reads_its_own_index(days, pg_url):
    """The statement of a hybrid search, planned on the published table (the planner kept from a
    scan: a few dozen rows): the vector leg through the HNSW index, the text leg through the GIN
    index, the hits joined back by chunk_id's."""
    import psycopg
    from psycopg import sql

    from pipeline.publish import search as found
    from pipeline.publish.index import Index
    from pipeline.publish.names import Names
    from pipeline.settings.config import PublishSettings, SearchSettings
    published_passages(days, pg_url)
    query = found.Query(10, sql.SQL("%(query)s::vector(32)"), QUERY, "simple",
                        (found.Filter("lang", "text", ("en",)),))
    statement, params = found.statement(Names("public", "embeddings"), Index(32), list(KEPT), query,
                                        PublishSettings(), SearchSettings())
    with psycopg.connect(pg_url) as conn:
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(r[0] for r in conn.execute(sql.SQL("EXPLAIN ") + statement,
                                                    {**params, "query": query_vector(QUERY, 32)}))
    assert "Index Scan using embedpipe_data_" in plan and "_hnsw on embedpipe_data_" in plan, plan
    assert "Bitmap Index Scan on embedpipe_data_" in plan and "_tsv" in plan, plan
    assert "_chunk on embedpipe_data_" in plan, plan


def test_a_table_published_before_the_passages_is_refused_with_the_command_that_adds_them(days, pg_url, caplog):
    import psycopg
    published_passages(days, pg_url)
    with psycopg.connect(pg_url) as conn:   # as an earlier embedpipe recorded it
        conn.execute("UPDATE embedpipe_published SET record = record - 'text_search'")
    for args in ([QUERY, "--mode", "text"], ["--like", "p-1"]):
        caplog.clear()
        assert main(["search", str(days.out), *args, "--to", pg_url]) == 2
        assert "was published without its passages' text search: publish it again, which adds it: python -m " \
               "pipeline publish " in caplog.text
    assert publish(days.out, pg_url) == 0   # the advice, followed
    assert main(["search", str(days.out), QUERY, "--mode", "text", "--to", pg_url]) == 0

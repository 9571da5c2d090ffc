"""search --where COLUMN=VALUE: typed by the column, bound as a parameter (a hostile value is only
a value), refused in one line (exit 2) for a column the table lacks or a value its type does not
parse, before anything is paid; with a selective filter, -k rows still come back from the vector
leg's index (pgvector's iterative scan) and from the text leg."""
from __future__ import annotations

import logging

import psycopg

from pipeline.cli import main
from tests.publish.helpers import view_rows
from tests.publish.searching import published_passages, search_json

HOSTILE = ["x' OR '1'='1", "'; DROP TABLE embeddings; --", "en\"; SELECT pg_sleep(10); --", "$1", "%(words)s",
           "{}", "\\", "en' --"]


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


def test_filters_apply_to_both_legs_and_hostile_values_are_only_values(days, pg_url, capsys):
    rows = published_passages(days, pg_url)
    lang = {r["id"]: r["lang"] for r in rows}
    for mode in ("hybrid", "vector", "text"):
        found = search_json(capsys, days, pg_url, "данные", "--mode", mode, "--where", "lang=ru", "-k", "5")
        assert found["results"] and {lang[r["doc_id"]] for r in found["results"]} == {"ru"}, mode
    both = search_json(capsys, days, pg_url, "budget", "--where", "lang=ru", "--where", "lang=zh", "-k", "50")
    assert {lang[r["doc_id"]] for r in both["results"]} == {"ru", "zh"}   # one column's values: either
    typed = search_json(capsys, days, pg_url, "budget", "--where", "day=2026-01-05", "--where", "score=4", "-k", "50")
    assert [r["doc_id"] for r in typed["results"]] == ["p-4"]
    charges = len(days.sandbox_ledger())
    for value in HOSTILE:
        found = search_json(capsys, days, pg_url, "budget", "--mode", "text", "--where", f"lang={value}")
        assert found["results"] == [], value
        found = search_json(capsys, days, pg_url, "budget", "--where", f"doc_id={value}")
        assert found["results"] == [], value
    assert len(days.sandbox_ledger()) == charges + len(HOSTILE)   # each hybrid query paid, nothing else
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM embeddings").fetchone()[0] == len(view_rows(days.out))


def test_unknown_columns_and_values_of_another_type_are_refused_before_anything_is_paid(days, pg_url, caplog):
    published_passages(days, pg_url)
    charges = len(days.sandbox_ledger())
    refused = {
        "lnag=en": "has no column lnag (did you mean lang?)",
        "LANG=en": "has no column LANG (did you mean lang?)",
        "Doc_ID=x": "has no column Doc_ID (did you mean doc_id?)",
        "embedding=[1]": "takes no --where on its column embedding",
        "chunk_index=abc": "'abc': not a value of chunk_index's type integer",
        "day=yesterday'; DROP TABLE embeddings; --": "not a value of day's type date",
        "score=1.5": "not a value of score's type bigint",
        "lang=en\x00": "a NUL character",
        "lang": "give COLUMN=VALUE",
        "=en": "give COLUMN=VALUE",
        "\"lang\"=en": "has no column \"lang\"",
    }
    for where, says in refused.items():
        caplog.clear()
        assert main(["search", str(days.out), "budget", "--where", where, "--to", pg_url, "--base-url",
                     days.base_url, "--models-config", str(days.models)]) == 2, where
        lines = errors(caplog)
        assert len(lines) == 1 and "\n" not in lines[0] and says in lines[0], (where, lines)
    assert len(days.sandbox_ledger()) == charges


def test_a_selective_filter_still_gives_k_rows_from_the_index(days, pg_url, capsys, monkeypatch, tmp_path):
    """The planner kept from a scan (PGOPTIONS reaches the search's session) and ef_search as
    small as k: the vector leg reads the HNSW graph, whose k nearest are mostly of other
    languages; the iterative scan goes on until k rows of the filter's come back."""
    rows = published_passages(days, pg_url)
    ru = [r["id"] for r in rows if r["lang"] == "ru"]
    config = tmp_path / "run.yaml"
    config.write_text("publish:\n  ef_search: 5\n")
    with monkeypatch.context() as env:   # undone before the database is dropped
        env.setenv("PGOPTIONS", "-c enable_seqscan=off -c enable_bitmapscan=off")
        found = search_json(capsys, days, pg_url, "budget vector", "--mode", "vector", "--where", "lang=ru", "-k",
                            str(len(ru)), "--run-config", str(config))
        liked = search_json(capsys, days, pg_url, "--like", "p-0", "-k", "10", "--where", "lang=ru",
                            "--run-config", str(config))
    assert sorted(r["doc_id"] for r in found["results"]) == sorted(ru)
    assert len(liked["results"]) == 10 and {r["kept"]["lang"] for r in liked["results"]} == {"ru"}


def test_where_alone_on_like_and_its_report(days, pg_url, capsys, caplog):
    published_passages(days, pg_url)
    caplog.set_level(logging.INFO)
    liked = search_json(capsys, days, pg_url, "--like", "p-1", "--where", "lang=en", "-k", "3")
    assert liked["where"] == ["lang=en"] and liked["mode"] == "vector" and liked["request"] is None
    assert all(r["doc_id"] != "p-1" for r in liked["results"])

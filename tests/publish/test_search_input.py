"""search against what a hostile or careless user gives it: passages and kept values holding a
terminal's escapes and bidi overrides (shown escaped, whole in --json), kept lists (as JSON), a
column whose name holds `=`, arguments that are not UTF-8, a query beginning with `-`, a query
longer than the model takes, an unreachable database: each a result or one line, never a
traceback, and nothing paid for a refusal."""
from __future__ import annotations

import json
import logging

import yaml

from pipeline.cli import main
from tests.e2e.money_helpers import MODEL
from tests.publish.helpers import publish, view_rows
from tests.publish.searching import passages, published_passages, search_json, write_passages

ESC = "hello \x1b[2J\x1b]0;pwned\x07 evilword here"
BIDI = "evilword \u202egnp.exe\u202c x"


def hostile_rows() -> list[dict]:
    rows = [{"id": r["id"], "text": r["text"], "tag": "ok", "tags": ["a"], "k": "x", "k=v": "0"} for r in passages(20)]
    rows += [{"id": "esc", "text": ESC, "tag": "\x1b[31mred", "tags": ["x", "y"], "k": "x", "k=v": "1"},
             {"id": "bidi", "text": BIDI, "tag": "ok", "tags": [], "k": "y", "k=v": "1"}]
    return rows


def published_hostile(days, url: str) -> None:
    corpus = write_passages(days.out.parent / "hostile.parquet", hostile_rows())
    assert days.run_file(corpus, "--keep-columns", "tag,tags,k,k=v") == 0
    assert publish(days.out, url) == 0


def printed(capsys, days, url: str, *args: str) -> str:
    capsys.readouterr()
    assert main(["search", str(days.out), *args, "--to", url, "--base-url", days.base_url,
                 "--models-config", str(days.models)]) == 0
    return capsys.readouterr().out


def errors(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


def test_controls_and_bidi_overrides_are_shown_escaped_and_kept_whole_in_json(days, pg_url, capsys):
    published_hostile(days, pg_url)
    shown = printed(capsys, days, pg_url, "evilword", "--mode", "text")
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert "hello \\x1b[2J\\x1b]0;pwned\\x07 evilword" in shown and "tag=\\x1b[31mred" in shown
    assert "\\u202egnp.exe\\u202c" in shown
    assert 'tags=["x", "y"]' in shown   # a kept list as JSON, as --json has it
    report = search_json(capsys, days, pg_url, "evilword", "--mode", "text")
    texts = {r["doc_id"]: r for r in report["results"]}
    assert texts["esc"]["text"] == ESC and texts["bidi"]["text"] == BIDI
    assert texts["esc"]["kept"]["tag"] == "\x1b[31mred" and texts["esc"]["kept"]["tags"] == ["x", "y"]


def test_a_column_whose_name_holds_an_equals_sign_is_filtered_on(days, pg_url, capsys):
    published_hostile(days, pg_url)
    both = search_json(capsys, days, pg_url, "evilword", "--mode", "text", "--where", "k=v=1")
    assert {r["doc_id"] for r in both["results"]} == {"esc", "bidi"}
    one = search_json(capsys, days, pg_url, "evilword", "--mode", "text", "--where", "k=y")
    assert [r["doc_id"] for r in one["results"]] == ["bidi"]
    assert one["where"] == ["k=y"] and both["where"] == ["k=v=1"]


def test_arguments_that_are_not_utf8_are_refused_naming_them_before_anything_is_sent(days, pg_url, caplog):
    published_passages(days, pg_url)
    charges, history = len(days.sandbox_ledger()), sorted((days.out / "history").iterdir())
    latin1 = "caf\udce9"   # b"caf\xe9" as Python holds a non-UTF-8 argument
    refused = {("budget", "--where", f"lang={latin1}"): "--where lang=caf\\xe9 is not valid UTF-8",
               (latin1,): "the text to search for caf\\xe9 is not valid UTF-8",
               (latin1, "--mode", "vector"): "the text to search for caf\\xe9 is not valid UTF-8",
               ("--like", latin1): "--like caf\\xe9 is not valid UTF-8"}
    for args, says in refused.items():
        caplog.clear()
        assert main(["search", str(days.out), *args, "--to", pg_url, "--base-url", days.base_url,
                     "--models-config", str(days.models)]) == 2, args
        lines = errors(caplog)
        assert len(lines) == 1 and says in lines[0], (args, lines)
    assert len(days.sandbox_ledger()) == charges and sorted((days.out / "history").iterdir()) == history


def test_a_query_over_the_models_limit_is_refused_before_any_request(days, pg_url, capsys, caplog):
    published_passages(days, pg_url)
    charges = len(days.sandbox_ledger())
    limit = yaml.safe_load(days.models.read_text())["models"][MODEL]["max_input_tokens"]
    long_query = " ".join(f"budget{i}" for i in range(limit))   # about 3 tokens a word
    for mode in ("hybrid", "vector"):
        caplog.clear()
        assert main(["search", str(days.out), long_query, "--mode", mode, "--to", pg_url, "--base-url",
                     days.base_url, "--models-config", str(days.models)]) == 2
        lines = errors(caplog)
        assert len(lines) == 1 and f"tokens (cl100k_base, as a run counts), more than the {limit:,}" in lines[0], lines
    assert len(days.sandbox_ledger()) == charges
    header = printed(capsys, days, pg_url, long_query, "--mode", "text").splitlines()[0]
    assert len(header) < 200 and "budget0 budget1" in header   # shortened on the screen
    assert search_json(capsys, days, pg_url, long_query, "--mode", "text")["query"] == long_query


def test_a_query_may_begin_with_a_dash_after_double_dash(days, pg_url, capsys, caplog):
    published_hostile(days, pg_url)
    capsys.readouterr()
    assert main(["search", str(days.out), "--mode", "text", "--to", pg_url, "--json", "--", "-hello evilword"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["query"] == "-hello evilword" and [r["doc_id"] for r in report["results"]] == ["bidi"]
    spaced = search_json(capsys, days, pg_url, "-pwned evilword", "--mode", "text")
    assert [r["doc_id"] for r in spaced["results"]] == ["bidi"]
    caplog.clear()
    assert main(["search", str(days.out), "a", "--mode", "text", "--to", pg_url, "--", "b"]) == 2
    assert "give the text to search for once" in errors(caplog)[0]
    caplog.clear()
    assert main(["search", str(days.out), "-pwned", "--mode", "text", "--to", pg_url]) == 2
    assert errors(caplog)[0].endswith("goes after '--': python -m pipeline search DIR [options] -- TEXT)")


def test_an_unreachable_database_is_one_line(days, pg_url, caplog):
    published_passages(days, pg_url)
    for args in (("E1234", "--mode", "text"), ("--like", "p-1")):
        caplog.clear()
        assert main(["search", str(days.out), *args, "--to", "postgresql://nouser@127.0.0.1:1/x"]) == 1
        lines = errors(caplog)
        assert len(lines) == 1 and lines[0].startswith("could not connect to the database at "), lines


def test_rows_without_text_are_counted_when_the_text_leg_finds_nothing(days, pg_url, capsys, caplog):
    corpus = write_passages(days.out.parent / "bare.parquet", passages(20))
    assert days.run_file(corpus, "--no-chunk-text") == 0
    assert publish(days.out, pg_url) == 0
    caplog.set_level(logging.WARNING)
    report = search_json(capsys, days, pg_url, "budget", "--mode", "text")
    rows = len(view_rows(days.out))
    assert report["results"] == [] and report["rows_without_text"] == rows
    assert any(f"{rows:,} of public.embeddings's rows have no text" in n for n in report["notes"])


def test_hybrid_without_searchable_words_says_the_vector_leg_ranked_alone(days, pg_url, capsys):
    published_passages(days, pg_url)
    shown = printed(capsys, days, pg_url, "!!! ???", "-k", "3")
    assert "by the vector leg alone" in shown and "reciprocal rank" not in shown and "rrf" not in shown
    assert search_json(capsys, days, pg_url, "!!! ???", "-k", "3")["rrf_k"] is None

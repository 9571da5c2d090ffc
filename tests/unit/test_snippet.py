"""A passage shortened around a query's words for the terminal (pipeline/commands/snippet.py)."""
from __future__ import annotations

import pytest

from pipeline.commands.snippet import ELLIPSIS, snippet

LONG = ("The for statement is used to iterate over the elements of a sequence (such as a string, tuple or "
        "list) or other iterable object. " * 3 + "A break statement executed in the first suite terminates "
        "the loop without executing the else clause's suite. " + "Filler words go on and on here. " * 10)


def test_a_short_passage_is_whole_with_its_whitespace_folded():
    assert snippet("a\n\n  b\tc", "b", 40) == "a b c"


@pytest.mark.parametrize("width", [30, 60, 120])
def test_the_window_holds_the_query_words_and_fits(width):
    shown = snippet(LONG, "the break statement", width)
    assert len(shown) <= width and "break" in shown
    assert shown.startswith(ELLIPSIS) and shown.endswith(ELLIPSIS)
    assert shown.strip(ELLIPSIS) in " ".join(LONG.split())   # cut at spaces: whole words


def test_the_window_prefers_the_most_distinct_words():
    text = "budget alone here. " * 20 + "budget and ledger together. " + "nothing more. " * 20
    assert "ledger" in snippet(text, "budget ledger", 40)


def test_words_match_by_prefix_and_in_unspaced_scripts():
    assert "searching" in snippet("x " * 100 + "searching the table " + "y " * 100, "search", 30)
    assert "向量搜索" in snippet("数" * 200 + " 向量搜索 " + "据" * 200, "向量", 20)
    assert "ракета" in snippet("слово " * 60 + "🚀 ракета 🚀 " + "слово " * 60, "Ракета", 30)


def test_no_match_shows_the_beginning():
    shown = snippet(LONG, "nothing matches zzz", 50)
    assert shown.startswith("The for statement") and shown.endswith(ELLIPSIS) and len(shown) <= 50

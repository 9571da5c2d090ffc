"""docs/postgres.md's hybrid statement, as written, pasted into an application: the ranking
`search` gives, and the passages with it."""
from __future__ import annotations

from tests.publish.searching import doc_ranking, doc_statement, published_passages, query_vector, ranking, search_json


def test_the_documented_statement_ranks_as_search_does(days, pg_url, capsys):
    published_passages(days, pg_url)
    assert "LIMIT 10;" in doc_statement()
    for words in ("budget rouble ledger", "данные поиск", "\"vector budget\" -ledger", "ракета"):
        report = search_json(capsys, days, pg_url, words)
        assert len(report["results"]) == 10
        assert doc_ranking(pg_url, words, query_vector(words, 32)) == ranking(report), words

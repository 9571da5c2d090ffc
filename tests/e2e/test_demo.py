"""`make run`'s demo: real text (the Python language reference in pydoc_data.topics), embedded
through the sandbox, published to the embedded PostgreSQL, and a question searched there (hybrid:
its words and its vector) whose answers a reader sees are right, each with its passage."""
from __future__ import annotations

import importlib.util

import pyarrow.parquet as pq

from pipeline import cli
from pipeline.commands import demo
from pipeline.corpora.python_docs import topics

# "the break statement in a loop" is answered by the break statement first, then by the loops it
# leaves and the statements beside it: for, while, continue, and the compound statements' chapter.
CONTROL_FLOW = {"for", "while", "break", "continue", "compound"}
SCREEN_LINES = 40


def test_the_corpus_is_every_topic_whole():
    from pydoc_data import topics as pydoc_topics
    assert [(r["id"], r["text"], r["topic"]) for r in topics()] == [(t, text, t) for t, text in
                                                                   sorted(pydoc_topics.topics.items())]


def test_the_demo_runs_and_its_search_answers_with_the_loops(reachable_tmp, capsys, monkeypatch):
    tmp_path = reachable_tmp   # the demo starts the embedded PostgreSQL, which runs as another user
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "")  # the demo sets its own key: restored afterwards
    assert cli.main(["demo", "--workdir", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    lines = printed.splitlines()
    assert len(lines) <= SCREEN_LINES, printed   # the plan, the run's summary, the neighbours: one screen
    assert any(line.split()[:1] == ["fits"] and line.split()[-1] == "yes" for line in lines), printed  # plan table
    done = next(i for i, line in enumerate(lines) if line.endswith("done (exit 0)"))
    assert [line.split()[0] for line in lines[done + 1:done + 6]] == ["read", "this", "view", "money", "files"]
    assert f"{tmp_path / 'out'}/current/" in lines[done + 5]
    assert f"== search: python -m pipeline search {tmp_path / 'out'} {demo.QUERY!r}" in printed
    assert demo.LEXICAL in printed   # what the sandbox's vectors are and are not, in one line
    assert lines[done + 6].startswith("published view") and "to public.embeddings at embedded" in lines[done + 6]
    header = next(i for i, line in enumerate(lines) if line.startswith("== search: "))
    answers = [line.split() for line in lines[header + 2:header + 7]]
    found = [a[1] for a in answers]
    assert found[0] == "break" and sum(t in CONTROL_FLOW for t in found) >= 4, answers
    passages = {(r["doc_id"], r["chunk_index"]): " ".join(r["text"].split()) for f in
                (tmp_path / "out" / "current").glob("embeddings-*.parquet") for r in
                pq.read_table(f, columns=["doc_id", "chunk_index", "text"]).to_pylist()}
    for line in lines[header + 2:header + 7]:   # each shown by its passage, around the query's words
        _, doc_id, index, shown = line.split(maxsplit=3)
        assert shown.strip("…") in passages[(doc_id, int(index.lstrip("#")))], line
    # passages sized for search: the topics were cut, none over the demo's size
    emb = [r for f in (tmp_path / "out" / "current").glob("embeddings-*.parquet") for r in
           pq.read_table(f, columns=["doc_id", "n_tokens"]).to_pylist()]
    assert len(emb) > 2 * len(topics()) and max(r["n_tokens"] for r in emb) <= demo.CHUNK_TOKENS
    if importlib.util.find_spec("matplotlib") is None:
        assert lines[-1].startswith("report") and "make dev" in lines[-1]
    else:
        assert lines[-1].startswith(f"report   {tmp_path / 'out' / 'report.png'}")
        assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""`make run`'s demo: real text (the Python language reference in pydoc_data.topics), embedded
through the sandbox, published to the embedded PostgreSQL, and a nearest-neighbour query in SQL
whose answers a reader sees are related."""
from __future__ import annotations

import importlib.util

import pyarrow.parquet as pq

from pipeline import cli
from pipeline.commands import demo
from pipeline.corpora.python_docs import topics

# The passage about "for" statements belongs with the other statements that steer a block:
# its own section in the "compound" chapter, while, if/else, and the break/continue that loops use.
CONTROL_FLOW = {"for", "while", "if", "else", "break", "continue", "compound"}
SCREEN_LINES = 40


def test_the_corpus_is_every_topic_whole():
    from pydoc_data import topics as pydoc_topics
    assert [(r["id"], r["text"], r["topic"]) for r in topics()] == [(t, text, t) for t, text in
                                                                   sorted(pydoc_topics.topics.items())]


def test_the_demo_runs_and_its_neighbours_are_about_control_flow(reachable_tmp, capsys, monkeypatch):
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
    assert f"== passages nearest to {demo.QUERY_ID}'s first, in SQL" in printed
    assert lines[done + 6].startswith("published view") and "to public.embeddings at embedded" in lines[done + 6]
    neighbours = demo.nearest(tmp_path / "out", demo.QUERY_ID)
    found = [doc_id for _, doc_id, _, _ in neighbours]
    assert sum(t in CONTROL_FLOW for t in found) >= 4, neighbours
    assert "while" in found, neighbours
    for _, doc_id, index, line in neighbours:   # each shown by its passage, from the view
        assert f"{doc_id} #{index}" in printed and line in printed and line
    # passages sized for search: the topics were cut, none over the demo's size
    emb = [r for f in (tmp_path / "out" / "current").glob("embeddings-*.parquet") for r in
           pq.read_table(f, columns=["doc_id", "n_tokens"]).to_pylist()]
    assert len(emb) > 2 * len(topics()) and max(r["n_tokens"] for r in emb) <= demo.CHUNK_TOKENS
    if importlib.util.find_spec("matplotlib") is None:
        assert lines[-1].startswith("report") and "pip install -e '.[report]'" in lines[-1]
    else:
        assert lines[-1].startswith(f"report   {tmp_path / 'out' / 'report.png'}")
        assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

"""`make run`'s demo: real text (the Python language reference in pydoc_data.topics), embedded
through the sandbox, published to the embedded PostgreSQL, and a nearest-neighbour query in SQL
whose answers a reader sees are related."""
from __future__ import annotations

import importlib.util

from pipeline import cli
from pipeline.commands import demo
from pipeline.corpora.python_docs import passages

# The passage about "for" statements belongs with the other statements that steer a block:
# its own section in the "compound" chapter, while, if/else, and the break/continue that loops use.
CONTROL_FLOW = {"for", "while", "if", "else", "break", "continue", "compound"}
SCREEN_LINES = 40


def test_the_corpus_is_a_few_hundred_passages_of_every_topic():
    rows = passages()
    from pydoc_data.topics import topics
    assert 200 <= len(rows) <= 600
    assert {r["topic"] for r in rows} == set(topics)
    assert all(r["id"].startswith(r["topic"] + ":") and r["text"].strip() for r in rows)
    assert len({r["id"] for r in rows}) == len(rows)


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
    assert f"== passages nearest to {demo.QUERY_ID}, in SQL" in printed
    assert lines[done + 6].startswith("published view") and "to public.embeddings at embedded" in lines[done + 6]
    neighbours = demo.nearest(tmp_path / "out", tmp_path / "corpus.parquet", demo.QUERY_ID)
    topics = [doc_id.split(":")[0] for _, doc_id, _ in neighbours]
    assert sum(t in CONTROL_FLOW for t in topics) >= 4, neighbours
    assert "while" in topics or any(h == 'The "while" statement' for _, _, h in neighbours), neighbours
    for _, doc_id, heading in neighbours:
        assert doc_id in printed and heading in printed
    if importlib.util.find_spec("matplotlib") is None:
        assert lines[-1].startswith("report") and "pip install -e '.[report]'" in lines[-1]
    else:
        assert lines[-1].startswith(f"report   {tmp_path / 'out' / 'report.png'}")
        assert (tmp_path / "out" / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

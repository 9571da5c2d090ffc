"""The CLI's commands on Prism give what they give on the local runner (twin.py compares).

Each test runs on both Prism variants: LOOPBACK workers (threads of the launcher) and EXTERNAL
ones (processes of a separate worker pool, as a Flink cluster runs Python)."""
from __future__ import annotations

from pathlib import Path

from tests.e2e.helpers import corpus_rows, write_corpus

MODEL = "text-embedding-3-small"


def test_run_and_plan(both, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    pair = both()
    pair.cli("plan", "--input", corpus, "--model", MODEL, "--base-url", "{base_url}")
    pair.cli("plan", "--input", corpus, "--model", MODEL, "--base-url", "{base_url}", "--json",
             "--max-spend-rub", "0.001")
    local, _ = pair.cli("run", "--input", corpus, "--output", "{out}", "--model", MODEL, "--base-url", "{base_url}",
                        "--keep-columns", "lang")
    assert local.code == 0 and len(local.view["embeddings"]) > 20 and local.view["failed"]


def _day2(rows: list[dict]) -> list[dict]:
    """The next day's corpus: one document edited, one removed, one added."""
    day2 = [dict(r) for r in rows if r["id"] != "en-3"]
    for r in day2:
        if r["id"] == "en-1":
            r["text"] += " Edited on day two."
    return day2 + [{"id": "en-new", "text": "A document that arrived on day two.", "lang": "en"}]


def test_day_2_sync(both, tmp_path):
    rows = corpus_rows()
    day1, day2 = write_corpus(tmp_path / "day1.parquet", rows), write_corpus(tmp_path / "day2.parquet", _day2(rows))
    pair = both()
    common = ("--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    pair.cli("run", "--input", day1, *common)
    local, _ = pair.cli("run", "--input", day2, *common, "--sync")
    assert local.code == 0 and local.summary["changes"] == {"added": 1, "edited": 1, "removed": 1, "unchanged": 24,
                                                             "resumed": 0}
    pair.cli("run", "--input", day2, *common, "--sync", "--doc-vectors")   # nothing to send, the documents' vectors


def test_resume_after_a_budget_stop(both, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    pair = both()
    common = ("--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    local, _ = pair.cli("run", "--input", corpus, *common, "--max-spend-rub", "0.001", "--allow-partial")
    assert local.code == 4 and local.summary["pending"] > 0 and local.summary["embedded"] == 0
    local, _ = pair.cli("run", "--resume", *common)      # the view's pending rows, without the input
    assert local.code == 0 and local.summary["pending"] == 0


def test_switch_model(both, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    pair = both()
    pair.cli("run", "--input", corpus, "--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    local, _ = pair.cli("run", "--input", corpus, "--output", "{out}", "--model", "text-embedding-3-large",
                        "--base-url", "{base_url}", "--sync", "--switch-model")
    assert local.code == 0 and local.summary["switch"]["switched"]

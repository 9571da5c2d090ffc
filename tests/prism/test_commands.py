"""The CLI's commands on Prism give what they give on the local runner (twin.py compares).

Each test runs on both Prism variants: LOOPBACK workers (threads of the launcher) and EXTERNAL
ones (processes of a separate worker pool, as a Flink cluster runs Python)."""
from __future__ import annotations

import json
import re

from tests.e2e.helpers import corpus_rows, write_corpus
from tests.e2e.money_helpers import PRICE_PER_1M, assert_every_row_once, billed_twice, write_models
from tests.e2e.money_helpers import corpus_rows as money_rows
from tests.e2e.money_helpers import write_corpus as money_corpus

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
    # summary.json names the runner, the Prism the launcher started and the pool its workers were in
    runner = json.loads((pair.prism.out / "summary.json").read_text())["runner"]
    flags = pair.prism.flags
    pool = flags[flags.index("--environment_config") + 1] if "--environment_config" in flags else None
    assert runner["name"] == "PrismRunner" and re.fullmatch(r"127\.0\.0\.1:\d+", runner["prism"]), runner
    assert runner.get("worker_pool") == pool and runner["environment_type"] == ("EXTERNAL" if pool else "LOOPBACK")


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


def test_a_budget_cut_partway_then_resume(both, tmp_path):
    """Many small requests, a cap that stops the run halfway: which rows are left pending follows
    the order texts reach the packer (each runner's own), so that step is checked by what must
    hold on both; the resume then ends in the same view, each text paid once."""
    models = write_models(tmp_path / "models.yaml")
    rows = money_rows(n_short=60, n_long=2)
    corpus = money_corpus(tmp_path / "corpus.parquet", rows)
    pair = both(balance=100.0, sandbox_args=["--models", models], price_per_token=PRICE_PER_1M / 1e6)
    common = ("--output", "{out}", "--model", MODEL, "--base-url", "{base_url}", "--models-config", models)
    for outcome, side in zip(pair.cli("run", "--input", corpus, *common, "--max-spend-rub", "0.3", "--allow-partial",
                                      compare=False), pair.sides, strict=True):
        s = outcome.summary
        assert outcome.code == 4 and s["pending"] and s["embedded"] and s["cost_rub"] <= 0.3, side.name
        assert_every_row_once(side.out, rows)
    pair.cli("run", "--input", corpus, *common, "--resume")
    for side in pair.sides:
        assert assert_every_row_once(side.out, rows)["pending"] == 0
        assert not billed_twice(side.ledger())


def test_mistakes_end_alike(both, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    pair = both()
    common = ("--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    pair.cli("run", "--input", corpus, *common)
    local, _ = pair.cli("run", "--input", corpus, *common)   # DIR holds results: --sync or --resume
    assert local.code == 2
    local, _ = pair.cli("run", "--input", tmp_path / "missing.parquet", *common, "--resume")
    assert local.code == 2

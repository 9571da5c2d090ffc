"""`plan --model all` (or a comma list): every catalogue model on one corpus, one row each,
cheapest first; `--json` is the array of what a one-model `plan --json` prints."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.corpora.sample import write_sample_corpus
from service.catalog import parse_models
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import MODEL, ledger, run, start_sandbox, write_models

REPO = Path(__file__).resolve().parents[2]
OTHER = "text-embedding-3-large"  # 8191-token chunks; write_models cuts MODEL's to 512
SAME = ("model", "documents", "chunks", "requests", "prompt_tokens", "estimated_cost_rub", "worst_case_rub",
        "spendable_rub", "fits", "price_source")


def plan(corpus: Path, sandbox, models: Path, model: str, *extra: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "pipeline", "plan", "--input", str(corpus), "--model", model,
            "--base-url", sandbox.base_url, "--models-config", str(models), *extra]
    return subprocess.run(argv, cwd=REPO, env={**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY},
                          capture_output=True, text=True, timeout=300)


@pytest.fixture
def setup(tmp_path, sandbox_factory):
    corpus = tmp_path / "corpus.parquet"
    write_sample_corpus(str(corpus), n_docs=80, seed=7)
    models = write_models(tmp_path / "models.yaml")
    return corpus, models, start_sandbox(sandbox_factory, models, balance=100.0)


@pytest.mark.soak   # slow: make soak
def test_all_models_json_is_the_array_of_one_model_plans(setup):
    corpus, models, sb = setup
    done = plan(corpus, sb, models, "all", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    every = json.loads(done.stdout)
    assert [p["model"] for p in every] == list(parse_models(models.read_text(), str(models)))
    for name in (MODEL, OTHER):
        one = plan(corpus, sb, models, name, "--json")
        single = json.loads(one.stdout)
        compared = next(p for p in every if p["model"] == name)
        assert {k: compared[k] for k in SAME} == {k: single[k] for k in SAME}
    by_model = {p["model"]: p for p in every}
    assert by_model[MODEL]["chunks"] > by_model[OTHER]["chunks"]  # each model split by its own limit
    assert ledger(sb) == []


def test_the_table_has_a_row_per_model_cheapest_first_and_exits_by_any_fit(setup):
    corpus, models, sb = setup
    done = plan(corpus, sb, models, f"{OTHER},{MODEL}")
    assert done.returncode == 0, done.stderr[-2000:]
    header, *rows = done.stdout.splitlines()
    assert header.split()[:3] == ["model", "tokens", "factor"] and "RUB per 1k docs" in header
    listed = [r.split()[0] for r in rows if r.split() and r.split()[0] in (MODEL, OTHER)]
    costs = {p["model"]: p["estimated_cost_rub"] for p in json.loads(
        plan(corpus, sb, models, f"{OTHER},{MODEL}", "--json").stdout)}
    assert listed == sorted(costs, key=costs.get)
    cheapest = min(costs.values())
    between = plan(corpus, sb, models, f"{OTHER},{MODEL}", "--max-spend-rub", f"{cheapest * 0.5:.6f}")
    assert between.returncode == 3 and " NO" in between.stdout and " yes" not in between.stdout


def test_a_learned_price_belongs_to_its_own_model(setup, tmp_path, monkeypatch):
    corpus, models, sb = setup
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    done = plan(corpus, sb, models, f"{MODEL},{OTHER}", "--json", "--output", str(out))
    sources = {p["model"]: p["price_source"] for p in json.loads(done.stdout)}
    assert sources == {MODEL: "learned from earlier requests", OTHER: "configs/models.yaml estimate"}


def test_models_that_cannot_take_the_chunk_size_are_marked_not_fitting(setup):
    """--chunk-tokens over some models' limit: the others are planned, those marked as not
    fitting with why; no model taking it at all is a usage error."""
    corpus, models, sb = setup
    done = plan(corpus, sb, models, "all", "--chunk-tokens", "1000", "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    every = {p["model"]: p for p in json.loads(done.stdout)}
    assert list(every) == list(parse_models(models.read_text(), str(models)))
    assert every[MODEL]["fits"] is False and "between 4 and 512 for " + MODEL in every[MODEL]["not_planned"]
    assert every[OTHER]["fits"] is True and every[OTHER]["chunks"] > 0 and "not_planned" not in every[OTHER]
    table = plan(corpus, sb, models, f"{OTHER},{MODEL}", "--chunk-tokens", "1000")
    assert table.returncode == 0, table.stderr[-2000:]
    row = next(r.split() for r in table.stdout.splitlines() if r.split()[:1] == [MODEL])
    assert row[-1] == "NO" and f"{MODEL}: not planned: --chunk-tokens must be between" in table.stdout
    alone = plan(corpus, sb, models, MODEL, "--chunk-tokens", "1000")
    assert alone.returncode == 2 and "between 4 and 512" in alone.stderr
    none = plan(corpus, sb, models, f"{OTHER},{MODEL}", "--chunk-tokens", "100000")
    assert none.returncode == 2 and "fits none of the models" in none.stderr, none.stderr[-2000:]
    assert ledger(sb) == []

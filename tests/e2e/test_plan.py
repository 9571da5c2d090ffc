"""`python -m pipeline plan`: one JSON object on stdout, exit 0 or 3, no embeddings request,
an estimate close to what `run` then spends, and a price learned from an earlier run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.corpora.sample import write_sample_corpus
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import MODEL, ledger, micro, run, start_sandbox, summary, write_models

REPO = Path(__file__).resolve().parents[2]
KEYS = ("chunks", "requests", "prompt_tokens", "estimated_cost_rub", "spendable_rub", "fits")


def plan(corpus: Path, sandbox, models: Path, *extra: str) -> tuple[int, dict]:
    argv = [sys.executable, "-m", "pipeline", "plan", "--input", str(corpus), "--model", MODEL,
            "--base-url", sandbox.base_url, "--models-config", str(models), "--json", *extra]
    proc = subprocess.run(argv, cwd=REPO, env={**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    return proc.returncode, json.loads(proc.stdout)   # exactly one JSON document, nothing else


@pytest.fixture
def corpus(tmp_path):
    """The project's sample corpus: prose, code, long documents, repeated texts, bad rows."""
    path = tmp_path / "corpus.parquet"
    write_sample_corpus(str(path), n_docs=80, seed=7)
    return path


def test_plan_prints_one_object_exits_by_fit_and_sends_nothing(tmp_path, sandbox_factory, corpus):
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, balance=100.0)
    code, fits = plan(corpus, sb, models)
    assert code == 0 and fits["fits"] is True
    assert all(k in fits for k in KEYS)
    assert fits["chunks"] > 0 and fits["requests"] > 0 and fits["prompt_tokens"] > 0
    assert fits["spendable_rub"] == pytest.approx(100.0)
    assert fits["estimated_cost_rub"] == pytest.approx(fits["prompt_tokens"] * 100 / 1e6, abs=1e-6)

    cap = fits["estimated_cost_rub"] / 2
    code, over = plan(corpus, sb, models, "--max-spend-rub", str(cap))
    assert code == 3 and over["fits"] is False and over["spendable_rub"] == pytest.approx(cap)
    assert over["estimated_cost_rub"] == fits["estimated_cost_rub"]
    assert ledger(sb) == []


def test_estimate_matches_the_run_and_a_price_is_learned(tmp_path, sandbox_factory, corpus, monkeypatch):
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, balance=100.0)
    _, estimate = plan(corpus, sb, models)
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    charges = ledger(sb)
    spent = micro(c["cost_rub"] for c in charges) / 1e6
    off = abs(estimate["estimated_cost_rub"] - spent) / spent
    print(f"\nplan {estimate['estimated_cost_rub']:.6f} RUB / {estimate['requests']} requests, run "
          f"{spent:.6f} RUB / {len(charges)} requests: {off:.4%} apart")
    assert off <= 0.02
    assert estimate["prompt_tokens"] == sum(c["prompt_tokens"] for c in charges)
    assert estimate["chunks"] == summary(out)["embedded"]

    # a stale catalogue price: plan takes the price the service really billed in OUT instead
    stale = write_models(tmp_path / "stale.yaml", price_per_1m=50.0)
    _, guessed = plan(corpus, sb, stale)
    _, learned = plan(corpus, sb, stale, "--output", str(out))
    assert guessed["price_rub_per_1m_tokens"] == pytest.approx(50.0)
    assert learned["price_rub_per_1m_tokens"] == pytest.approx(100.0, rel=1e-4)
    assert "learned" in learned["price_source"]
    # and estimates only what a run into OUT would pay: nothing, every document is unchanged there
    assert learned["estimated_cost_rub"] == 0 and learned["requests"] == 0
    assert learned["changes"]["unchanged"] == guessed["changes"]["added"] > 0
    assert len(ledger(sb)) == len(charges)


def test_plan_warns_of_nuls_that_publish_would_refuse(tmp_path, sandbox_factory):
    """A NUL in a text or an id: one line on stderr naming how many documents and the first,
    the plan itself unchanged on stdout. Under --no-chunk-text the text is not published, so a
    NUL there is not named."""
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, balance=100.0)
    path = tmp_path / "nul.parquet"
    pq.write_table(pa.table({"id": ["a", "b\x00", "c", "d"], "text": ["fine", "fine too", "a \x00 b", "ok"]}), path)
    argv = [sys.executable, "-m", "pipeline", "plan", "--input", str(path), "--model", MODEL,
            "--base-url", sb.base_url, "--models-config", str(models), "--json"]
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and json.loads(proc.stdout)["fits"] is True
    lines = [line for line in proc.stderr.splitlines() if "NUL" in line]
    assert len(lines) == 1 and "2 documents: 'b\\x00', 'c'" in lines[0], proc.stderr
    proc = subprocess.run([*argv, "--no-chunk-text"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in proc.stderr.splitlines() if "NUL" in line]
    assert len(lines) == 1 and "of document 'b\\x00';" in lines[0], proc.stderr
    assert ledger(sb) == []

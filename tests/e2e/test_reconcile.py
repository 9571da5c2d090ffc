"""Reconciliation against the sandbox ledger: exact to the micro-rouble in a clean run, and in a
run whose slow answers were billed after the client gave up, the difference is named."""
from __future__ import annotations

import collections

import pytest
import yaml

from pipeline.settings.config import default_settings_text
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (corpus_rows, current, ledger, micro, run, start_sandbox, summary, write_corpus,
                                     write_models)


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def to_micro(rub: float) -> int:
    return round(rub * 1e6)


def test_clean_run_reconciles_exactly(tmp_path, sandbox_factory, env_key):
    models = write_models(tmp_path / "models.yaml")
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=100, n_long=2))
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models) == 0
    charges, s = ledger(sb), summary(out)
    rows = micro(current(out, "embeddings").column("cost_rub").to_pylist())
    requests = micro(current(out, "requests").column("cost_rub").to_pylist())
    billed = micro(c["cost_rub"] for c in charges)
    delta = to_micro(s["balance_before"]) - to_micro(s["balance_after"])
    assert rows == requests == billed == delta == to_micro(s["cost_rub"]) > 0
    recon = s["reconciliation"]
    assert recon["rows_minus_requests_rub"] == 0 and recon["balance_minus_requests_rub"] == 0
    assert to_micro(recon["balance_delta_rub"]) == delta
    assert to_micro(recon["stats_delta_rub"]) == delta
    assert recon["notes"] == []
    assert recon["lost"]["count"] == 0 and recon["others_rub"] == 0 and recon["unexplained_rub"] == 0
    assert to_micro(charges[-1]["balance_after"]) == to_micro(s["balance_after"])


def test_answers_billed_after_a_client_timeout_are_named(tmp_path, sandbox_factory, env_key):
    settings = yaml.safe_load(default_settings_text())
    settings["client"].update(read_timeout_s=1.0, initial_backoff_s=0.1, max_backoff_s=0.5)
    run_config = tmp_path / "pipeline.yaml"
    run_config.write_text(yaml.safe_dump(settings))
    models = write_models(tmp_path / "models.yaml")
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=60, n_long=0))
    # a quarter of the answers are billed, then held back beyond the client's read timeout
    sb = start_sandbox(sandbox_factory, models, args=["--rate-slow", "0.25", "--slow-s", "3", "--seed", "5"])
    out = tmp_path / "out"
    assert run(corpus, out, sb, models, "--run-config", str(run_config)) == 0
    charges, s = ledger(sb), summary(out)
    requests = current(out, "requests")
    billed, answered = micro(c["cost_rub"] for c in charges), micro(requests.column("cost_rub").to_pylist())
    # the timed-out attempts carried the same X-Request-Id as the retry that was answered
    per_id = collections.Counter(c["request_id"] for c in charges)
    unseen = sum(to_micro(c["cost_rub"]) * (per_id[c["request_id"]] - 1) / per_id[c["request_id"]]
                 for c in charges)
    assert billed > answered and round(unseen) == billed - answered
    recon = s["reconciliation"]
    assert to_micro(recon["balance_minus_requests_rub"]) == billed - answered > 0
    assert to_micro(recon["balance_delta_rub"]) == billed
    assert recon["rows_minus_requests_rub"] == 0
    assert any("timed out" in note for note in recon["notes"])
    # each unseen charge is named as a retried attempt of its answered request, to the micro-rouble
    assert (to_micro(recon["lost"]["retried"]["rub"]), recon["lost"]["retried"]["count"]) == (
        billed - answered, sum(n - 1 for n in per_id.values()))
    assert recon["others_rub"] == 0 and recon["unexplained_rub"] == 0, recon["notes"]
    assert s["requests_retried"] >= sum(1 for n in per_id.values() if n > 1)
    print(f"\nbilled {billed} µRUB, answered {answered} µRUB, named difference "
          f"{recon['balance_minus_requests_rub']} RUB over {sum(n - 1 for n in per_id.values())} unseen charges")


@pytest.mark.soak   # slow: make soak
def test_a_request_lost_after_a_switch_is_priced_at_its_own_model(tmp_path, sandbox_factory, env_key):
    """DIR built on one model (300 RUB per 1M), switched to another (100), then a day whose one
    request times out on both attempts, billed each time: its charges are the job's own, named
    as lost at its model's price, to the micro-rouble (the history holds both models' bills)."""
    from tests.e2e.test_switch import MODEL, OTHER, write_models as switch_models
    from tests.e2e.test_switch import run as run_model

    models = switch_models(tmp_path / "models.yaml")
    settings = yaml.safe_load(default_settings_text())
    settings["client"].update(read_timeout_s=1.0, read_timeout_max_s=1.5, initial_backoff_s=0.1, max_backoff_s=0.2)
    run_config = tmp_path / "pipeline.yaml"
    run_config.write_text(yaml.safe_dump(settings))
    day = corpus_rows(n_short=20, n_long=0)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", day), tmp_path / "out"
    sb = start_sandbox(sandbox_factory, models)
    assert run_model(corpus, out, sb, models, OTHER) == 0
    assert run_model(corpus, out, sb, models, MODEL, "--sync", "--switch-model") == 0
    assert summary(out)["switch"]["switched"]
    sb.stop()
    day[0] = dict(day[0], text=day[0]["text"] + " edited")
    write_corpus(corpus, day)
    before = len(ledger(sb))
    # every answer is billed, then held back beyond the client's read timeout
    slow = start_sandbox(sandbox_factory, models, db=sb.db, args=["--rate-slow", "1.0", "--slow-s", "4"])
    assert run_model(corpus, out, slow, models, MODEL, "--sync", "--run-config", str(run_config)) == 1
    lost = ledger(slow)[before:]
    assert {c["model"] for c in lost} == {MODEL} and len(lost) == 2   # one request, two attempts
    recon = summary(out)["reconciliation"]
    assert (recon["lost"]["in_flight"]["count"], to_micro(recon["lost"]["in_flight"]["rub"])) == (
        2, micro(c["cost_rub"] for c in lost)), recon["notes"]
    assert recon["others_rub"] == 0 and recon["unexplained_rub"] == 0, recon["notes"]

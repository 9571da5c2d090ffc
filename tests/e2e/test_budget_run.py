"""Budget-capped runs against the sandbox: the cap holds within the stated overshoot bound
(max-in-flight x workers x the largest request's cost), the rest is pending and resumable,
and nothing is ever billed twice."""
from __future__ import annotations

import json

import pytest

from pipeline.cli import main
from pipeline.settings.config import default_settings_text, parse_settings
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, current, ledger, micro,
                                     run, start_sandbox, summary, write_corpus, write_models)

CAP_RUB = 1.0   # about half of what the corpus costs (~2.1 RUB)
MAX_IN_FLIGHT = parse_settings(default_settings_text()).embed.max_in_flight


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


@pytest.fixture
def setup(tmp_path, env_key):
    rows = corpus_rows()
    return rows, write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")


def check_cap(charges: list[dict], cap_rub: float, workers: int) -> tuple[int, int]:
    """Spend within the cap plus the bound, and at least half the cap used. (spent, bound) in micro."""
    spent = micro(c["cost_rub"] for c in charges)
    bound = MAX_IN_FLIGHT * workers * max(round(c["cost_rub"] * 1e6) for c in charges)
    cap = round(cap_rub * 1e6)
    print(f"\ncap {cap} µRUB, spent {spent} µRUB, overshoot {max(0, spent - cap)} µRUB, bound {bound} µRUB "
          f"({workers} worker(s), {len(charges)} requests)")
    assert spent <= cap + bound
    assert spent >= cap // 2
    return spent, bound


def test_capped_run_stops_within_the_bound_and_resume_pays_only_the_rest(tmp_path, sandbox_factory, setup):
    rows, corpus, models = setup
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models, "--max-spend-rub", str(CAP_RUB), "--allow-partial") == 4
    first = ledger(sb)
    check_cap(first, CAP_RUB, workers=1)
    pending = current(out, "pending")
    assert pending is not None and set(pending.column("reason").to_pylist()) == {"budget_exhausted"}
    assert summary(out)["pending_reasons"] == {"budget_exhausted": pending.num_rows}
    kinds = assert_every_row_once(out, rows)
    assert kinds["embeddings"] > 0 and kinds["pending"] > 0

    assert run(corpus, out, sb, models, "--resume") == 0
    charges = ledger(sb)
    assert len(charges) > len(first)
    assert billed_twice(charges) == {}
    kinds = assert_every_row_once(out, rows)
    assert kinds["pending"] == 0 and kinds["failed"] == 1          # the empty text
    # the current files hold exactly what the ledger billed, across both runs
    requests, emb = current(out, "requests"), current(out, "embeddings")
    assert sorted(requests.column("request_id").to_pylist()) == sorted(c["request_id"] for c in charges)
    assert micro(emb.column("cost_rub").to_pylist()) == micro(c["cost_rub"] for c in charges)


def test_estimate_over_the_cap_without_allow_partial_sends_nothing(tmp_path, sandbox_factory, setup):
    rows, corpus, models = setup
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models, "--max-spend-rub", str(CAP_RUB)) == 3
    assert ledger(sb) == []
    assert set(current(out, "pending").column("reason").to_pylist()) == {"estimate_exceeds_budget"}
    kinds = assert_every_row_once(out, rows)
    assert kinds["embeddings"] == 0


@pytest.mark.parametrize("mode", ["multi_threading", "multi_processing"])
def test_two_workers_hold_the_bound(tmp_path, sandbox_factory, setup, mode):
    rows, corpus, models = setup
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    code = run(corpus, out, sb, models, "--max-spend-rub", str(CAP_RUB), "--allow-partial",
               "--direct_num_workers", "2", "--direct_running_mode", mode)
    assert code == 4
    check_cap(ledger(sb), CAP_RUB, workers=2)
    assert_every_row_once(out, rows)


def test_key_budget_is_a_cap_the_service_enforces(tmp_path, sandbox_factory, setup):
    """No --max-spend-rub: the key's budget is the spendable amount."""
    rows, corpus, models = setup
    budget = 0.8
    sb = start_sandbox(sandbox_factory, models, budget=budget)
    out = tmp_path / "out"
    assert run(corpus, out, sb, models, "--allow-partial") == 4
    charges = ledger(sb)
    assert micro(c["cost_rub"] for c in charges) <= round(budget * 1e6)
    reasons = set(current(out, "pending").column("reason").to_pylist())
    assert reasons and reasons <= {"budget_exhausted", "insufficient_balance"}
    assert_every_row_once(out, rows)


def test_a_402_stops_spending_and_leaves_the_rest_pending(tmp_path, sandbox_factory, env_key):
    """The production service pre-checks against the model's maximum context, so it answers
    402 while the job's own guard still sees room: the run must stop at once, exit 4."""
    rows = corpus_rows(n_long=0)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    budget = 0.5
    sb = start_sandbox(sandbox_factory, models, budget=budget, args=["--precheck"])
    out = tmp_path / "out"
    assert run(corpus, out, sb, models, "--allow-partial") == 4
    charges = ledger(sb)
    assert charges and micro(c["cost_rub"] for c in charges) <= round(budget * 1e6)
    assert "insufficient_balance" in set(current(out, "pending").column("reason").to_pylist())
    assert_every_row_once(out, rows)
    assert billed_twice(charges) == {}


def test_a_cap_the_preflight_accepts_is_not_stopped_partway(tmp_path, sandbox_factory, setup, capsys):
    """Without --allow-partial the outcome is all or nothing: a cap equal to the estimate either
    fits (everything is delivered, exit 0) or does not (exit 3, nothing sent)."""
    rows, corpus, models = setup
    sb = start_sandbox(sandbox_factory, models)
    assert main(["plan", "--input", str(corpus), "--model", MODEL, "--base-url", sb.base_url,
                 "--models-config", str(models), "--json"]) == 0
    estimate = json.loads(capsys.readouterr().out)["estimated_cost_rub"]
    out = tmp_path / "out"
    code = run(corpus, out, sb, models, "--max-spend-rub", repr(estimate))
    pending = current(out, "pending")
    print(f"\ncap = estimate = {estimate} RUB: exit {code}, spent {micro(c['cost_rub'] for c in ledger(sb))} µRUB, "
          f"pending {summary(out)['pending_reasons']}")
    assert code in (0, 3)
    if code == 3:
        assert ledger(sb) == []
    else:
        assert pending is None or pending.num_rows == 0

"""Money across kills: a run SIGKILLed at a random point (the service keeps billing what was in
flight), then `run --resume`. summary.json reconciles DIR's whole history against the balance
since the first start, and its parts match the sandbox's ledger to the micro-rouble: the
charges of this job that have no row are `lost`, another client's charges are `others`."""
from __future__ import annotations

import os
import random
import signal
import time

import pytest

from service.client import EmbeddingsClient
from service.credentials import ApiKey
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, corpus_rows, current, journal_files, ledger, micro,
                                     run, start_job, start_sandbox, summary, wait_for_journal, write_corpus,
                                     write_models)

LATENCY_MS = 40        # the service bills a request this long after it arrives, answer or not
IN_FLIGHT = 3


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def spend_elsewhere(sb, n: int) -> None:
    """Another job on the same account: its own texts, its own request ids."""
    with EmbeddingsClient(sb.base_url, ApiKey(SANDBOX_KEY)) as client:
        for i in range(n):
            client.embed(MODEL, [f"another job's text number {i}"], request_id=f"other-{i}")


def wait_for_ledger_to_settle(sb) -> None:
    """What the killed run had in flight is billed within the latency; wait until it has been."""
    seen = -1
    while len(ledger(sb)) != seen:
        seen = len(ledger(sb))
        time.sleep(5 * LATENCY_MS / 1000)


@pytest.mark.parametrize("seed,others", [(1, 0), (2, 0), (3, 0), (4, 3)])
def test_reconciliation_after_a_random_kill_matches_the_ledger(tmp_path, sandbox_factory, env_key, seed, others):
    rng = random.Random(seed)
    rows = corpus_rows(n_short=120, n_long=1, seed=seed)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    out, log = tmp_path / "out", tmp_path / "job.log"
    proc = start_job(corpus, out, sb, models, log, "--max-in-flight", str(IN_FLIGHT))
    try:
        if others:  # early in the run, then enough answers that nothing sent later can sit before it
            wait_for_journal(proc, out, 1, log)
            spend_elsewhere(sb, others)
            wait_for_journal(proc, out, len(journal_files(out)) + 2 * IN_FLIGHT, log)
        wait_for_journal(proc, out, len(journal_files(out)) + rng.randint(1, 12), log)
        time.sleep(rng.uniform(0, 0.1))
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    wait_for_ledger_to_settle(sb)
    assert run(corpus, out, sb, models, "--resume") == 0
    assert assert_every_row_once(out, rows)["pending"] == 0

    charges, s = ledger(sb), summary(out)
    recon = s["reconciliation"]
    mine = [c for c in charges if not c["request_id"].startswith("other-")]
    rows_micro = micro(current(out, "embeddings").column("cost_rub").to_pylist())
    delivered = set(current(out, "embeddings").column("request_id").to_pylist())
    billed_micro = micro(c["cost_rub"] for c in charges)
    # the truth: every charge of this job that is not a delivered request's one charge
    lost_truth = micro(c["cost_rub"] for c in mine) - rows_micro
    lost_count = len(mine) - len(delivered)
    parts = [recon["rows_cost_rub"], recon["lost"]["rub"], recon["others_rub"], recon["unexplained_rub"]]
    assert micro(parts) == round(recon["balance_delta_rub"] * 1e6) == billed_micro
    assert round(recon["rows_cost_rub"] * 1e6) == rows_micro
    assert (round(recon["lost"]["rub"] * 1e6), recon["lost"]["count"]) == (lost_truth, lost_count), recon
    assert round(recon["others_rub"] * 1e6) == micro(c["cost_rub"] for c in charges
                                                     if c["request_id"].startswith("other-"))
    assert recon["unexplained_rub"] == 0, recon["notes"]
    assert len(recon["runs"]) == 2 and recon["since"]["run_id"] == recon["runs"][0]
    print(f"\nseed {seed}: billed {billed_micro} µRUB, rows {rows_micro}, lost {lost_count} requests "
          f"{lost_truth} µRUB, others {recon['others_rub']} RUB")

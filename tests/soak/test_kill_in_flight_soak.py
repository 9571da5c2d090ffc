"""Soak: a run SIGKILLed (its whole process group) while requests are in flight, at a price
whose bills round half a micro-rouble (2.5 RUB per 1M tokens: 1 token bills 3 micro-roubles).
The service bills what was in flight after the client is gone; the same command then pays
those texts again, bounded by what was in flight. summary.json's reconciliation names every
such charge `lost.in_flight`, to the micro-rouble against the sandbox's ledger: never
`unexplained`, never another's spending.

    make soak        (pytest -m soak -s: prints the figures)
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (assert_every_row_once, billed_twice, corpus_rows, current, journal_files,
                                     ledger, micro, run, start_job, start_sandbox, summary, wait_for_journal,
                                     write_corpus, write_models)

pytestmark = pytest.mark.soak

LATENCY_MS = 400       # requests stay in flight this long: a kill always finds some
IN_FLIGHT = 4
PRICE_PER_1M = 2.5     # the catalogue's own price of the default model: bills round half a micro-rouble


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


@pytest.mark.parametrize("seed,answers", [(11, 3), (12, 9), (13, 20)])
def test_answers_billed_after_a_kill_are_lost_in_flight_to_the_micro_rouble(tmp_path, sandbox_factory, env_key,
                                                                            seed, answers):
    rows = corpus_rows(n_short=300, n_long=2, seed=seed)
    corpus = write_corpus(tmp_path / "corpus.parquet", rows)
    models = write_models(tmp_path / "models.yaml", price_per_1m=PRICE_PER_1M)
    sb = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    out, log = tmp_path / "out", tmp_path / "job.log"
    proc = start_job(corpus, out, sb, models, log, "--max-in-flight", str(IN_FLIGHT), "--sync")
    try:
        wait_for_journal(proc, out, answers, log)
        time.sleep(LATENCY_MS / 2000)   # half-way through the next answers
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    journaled = {p.stem for p in journal_files(out)}
    time.sleep(3 * LATENCY_MS / 1000)   # what was in flight is billed within the latency
    at_kill = ledger(sb)
    in_flight = [c for c in at_kill if c["request_id"] not in journaled]
    assert in_flight, "the kill found no request in flight"

    started = time.monotonic()
    assert run(corpus, out, sb, models, "--sync", "--max-in-flight", str(IN_FLIGHT)) == 0
    seconds = time.monotonic() - started
    assert assert_every_row_once(out, rows)["pending"] == 0
    charges, recon = ledger(sb), summary(out)["reconciliation"]
    twice = billed_twice(charges)
    # paid again: only texts that were in flight, each once more
    assert set(twice) <= {h for c in in_flight for h in c["input_sha256"]} and set(twice.values()) <= {2}
    lost = recon["lost"]["in_flight"]
    assert (lost["count"], round(lost["rub"] * 1e6)) == (len(in_flight), micro(c["cost_rub"] for c in in_flight)), \
        recon["notes"]
    assert recon["unexplained_rub"] == 0 and recon["others_rub"] == 0, recon["notes"]
    rows_micro = micro(current(out, "embeddings").column("cost_rub").to_pylist())
    assert rows_micro + round(recon["lost"]["rub"] * 1e6) == micro(c["cost_rub"] for c in charges)
    print(f"\nkill after {answers} answers: {len(in_flight)} requests in flight billed "
          f"{micro(c['cost_rub'] for c in in_flight)} µRUB, {len(twice)} texts billed twice, "
          f"total {micro(c['cost_rub'] for c in charges) / 1e6:.6f} RUB; rerun {seconds:.1f} s, exit 0")

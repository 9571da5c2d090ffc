"""Soak: the disk under --output fills while a day's run has requests in flight (the sandbox's
--latency-ms keeps them out), at several moments. The run stops with one line naming DIR,
exit 1, the served view still the day before's; once space is freed the same command
completes, and the sandbox's ledger shows no text billed twice: every answer paid before the
disk filled was kept. No temporary file of the failed run is left.

    make soak        (pytest -m soak -s: prints the figures)
"""
from __future__ import annotations

import os
import subprocess
import time

import pytest

from tests.conftest import SANDBOX_KEY, fill
from tests.e2e.money_helpers import (REPO, billed_twice, corpus_rows, job_argv, journal_files, ledger, micro,
                                     start_job, start_sandbox, summary, write_corpus, write_models)
from tests.e2e.test_full_disk import temporary_files

pytestmark = pytest.mark.soak

LATENCY_MS = 200
IN_FLIGHT = "4"


def wait_for(proc: subprocess.Popen, out, n: int, log) -> None:
    deadline = time.monotonic() + 120
    while len(journal_files(out)) < n:
        assert proc.poll() is None, f"the run ended ({proc.returncode}) first:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline
        time.sleep(0.002)


@pytest.mark.parametrize("answers,leave", [(1, 0), (8, 0), (25, 4096), (60, 64 << 10)])
def test_a_disk_that_fills_mid_run_pays_nothing_twice(tmp_path, small_disk, sandbox_factory, monkeypatch,
                                                      answers, leave):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, args=["--latency-ms", str(LATENCY_MS)])
    rows = corpus_rows(n_short=500, n_long=2, seed=answers)
    corpus, out = write_corpus(tmp_path / "corpus.parquet", rows[:100]), small_disk / "out"
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    argv = job_argv(corpus, out, sb, models, "--max-in-flight", IN_FLIGHT, "--sync")
    assert subprocess.run(argv, cwd=REPO, env=env, capture_output=True).returncode == 0   # day 1
    served = (out / "_current.json").read_text()
    write_corpus(corpus, rows)   # day 2: 400 documents more

    log = tmp_path / "day2.log"
    started = time.monotonic()
    proc = start_job(corpus, out, sb, models, log, "--max-in-flight", IN_FLIGHT, "--sync")
    wait_for(proc, out, answers, log)
    filler = fill(small_disk, leave)
    code, first_s = proc.wait(120), time.monotonic() - started
    text = log.read_text()
    errors = [line for line in text.splitlines() if " ERROR " in line]
    assert code == 1 and len(errors) == 1 and "Traceback" not in text, text[-3000:]
    assert f"--output {out}: no space left on its disk" in errors[0]
    assert (out / "_current.json").read_text() == served    # the served view: day 1's, whole
    time.sleep(3 * LATENCY_MS / 1000)   # anything still out is billed by now
    paid_before = ledger(sb)

    os.remove(filler)
    started = time.monotonic()
    again = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True)
    second_s = time.monotonic() - started
    assert again.returncode == 0, again.stderr[-3000:]
    charges = ledger(sb)
    assert billed_twice(charges) == {}, f"{len(billed_twice(charges))} texts billed twice"
    assert summary(out)["pending"] == 0 and temporary_files(out) == []
    print(f"\nfull after {answers} answers ({leave} bytes left): exit {code} in {first_s:.1f} s having paid "
          f"{len(paid_before)} requests; after freeing: exit 0 in {second_s:.1f} s, 0 texts billed twice, "
          f"{micro(c['cost_rub'] for c in charges) / 1e6:.6f} RUB in all")

"""The job against a service with a capacity (the sandbox's --capacity): in 429 mode the limiter
meets the refusals, and the run still delivers every row exactly as a run without limits does,
paying for nothing twice, with one worker process and with two; in queue mode too. Figures
(429 counts, the limits reached) are measured by `make bench`, not asserted here."""
from __future__ import annotations

import collections

import pytest
import yaml

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import current_rows, ledger, run, summary
from tests.e2e.test_faults import MODEL, PER_REQUEST, models_config, run_config, write_docs

DOCS = 24 * PER_REQUEST   # 24 requests


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory):
    """The rows of a run against a service without a capacity: what every other run must match."""
    tmp = tmp_path_factory.mktemp("unlimited")
    write_docs(tmp / "c.parquet", DOCS)
    return _job(tmp, [])[0]


def _job(tmp, sandbox_args, *job_args, rate_limits=None):
    from service.sandbox.launcher import SandboxProcess  # a module fixture cannot use sandbox_factory
    corpus, out = tmp / "c.parquet", tmp / "out"
    if not corpus.exists():
        write_docs(corpus, DOCS)
    with SandboxProcess(tmp / "sb.db", key=SANDBOX_KEY, balance=10.0,
                        args=["--latency-ms", "150", *sandbox_args]) as sb:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
            code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                       "--models-config", str(models_config(tmp)), "--run-config", str(_config(tmp, rate_limits)),
                       *job_args)
        assert code == 0
        charges = ledger(sb.db)
    rows = {(r["doc_id"], r["chunk_index"]): (r["text_sha256"], r["embedding"])
            for r in current_rows(out, "embeddings")}
    return rows, charges, summary(out)


def _config(tmp, rate_limits):
    path = run_config(tmp)
    if rate_limits:
        doc = yaml.safe_load(path.read_text())
        doc["rate_limits"].update(rate_limits)
        path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("mode, workers", [("429", 1), ("429", 2), ("queue", 1)])
def test_a_service_at_capacity_gets_every_row_paid_once(tmp_path, unlimited, mode, workers):
    extra = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing") if workers > 1 else ()
    rows, charges, s = _job(tmp_path, ["--capacity", "2", "--capacity-mode", mode], *extra)
    assert rows == unlimited                                    # the same rows, the same vectors
    paid = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert len(paid) == DOCS and max(paid.values()) == 1         # nothing paid twice
    assert s["requests"] == len(charges) and s["pending"] == 0 and s["failed"] == 0
    print(f"\ncapacity 2, {mode}, {workers} worker(s): {s['requests']} requests, "
          f"{s['metrics'].get('retries', 0)} retries")


def test_a_known_quota_is_kept_without_429s(tmp_path, unlimited):
    """rate_limits.requests_per_minute below the service's rate: the adaptive limit never meets a
    429, because the token bucket paces the requests first."""
    rows, charges, s = _job(tmp_path, ["--embeddings-rps", "6", "--embeddings-burst", "6"],
                            rate_limits={"requests_per_minute": 300})
    assert rows == unlimited and len(charges) == s["requests"]
    assert s["metrics"].get("retries", 0) == 0 and s["metrics"].get("rate_limited", 0) == 0

"""The job against a service that rate-limits embeddings: 429s are absorbed (Retry-After,
AIMD halving the in-flight limit), every row is delivered once, nothing is paid twice. The
429 count is printed; docs/BENCH.md compares fixed concurrency with AIMD."""
from __future__ import annotations

import collections

import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import current_rows, ledger, run, summary, write_corpus
from tests.e2e.test_faults import MODEL, PER_REQUEST, models_config, run_config


@pytest.mark.soak   # slow: make soak
def test_a_rate_limited_service_slows_the_job_down_but_loses_nothing(tmp_path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    rows = [{"id": f"d{i}", "text": f"rate limited document {i} of the corpus", "lang": "en"}
            for i in range(16 * PER_REQUEST)]
    corpus, out = write_corpus(tmp_path / "c.parquet", rows), tmp_path / "out"
    sb = sandbox_factory(key=SANDBOX_KEY, balance=10.0,
                         args=["--embeddings-rps", "4", "--embeddings-burst", "2", "--retry-after-s", "1"])
    code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--models-config", str(models_config(tmp_path)), "--max-in-flight", "6",
               "--run-config", str(run_config(tmp_path, max_attempts=10)))
    assert code == 0
    s = summary(out)
    emb = current_rows(out, "embeddings")
    assert sorted(r["doc_id"] for r in emb) == sorted(r["id"] for r in rows)
    assert s["requests"] == len(ledger(sb.db)) == 16
    sent = collections.Counter(h for c in ledger(sb.db) for h in c["input_sha256"])
    assert max(sent.values()) == 1
    print(f"\nrate limited: {s['requests']} requests, {s['requests_retried']} retried, "
          f"{s['metrics'].get('retries', 0)} retries in all")

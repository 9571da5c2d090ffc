"""A key the service does not allow the run's model (403), as when a team moves its corpus to
a model its key may not use: the run stops with exit 1 and a message that says so, every chunk
is left pending as `forbidden` (a resume with a key allowed the model sends it), nothing is paid."""
from __future__ import annotations

import collections
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import requests
import yaml

from tests.e2e.helpers import ledger, read_kind, run, summary

KEY = "sk-e2e-small-only"
ALLOWED, RUN_MODEL = "text-embedding-3-small", "text-embedding-3-large"
DOCS = 24


def test_a_key_not_allowed_the_model_stops_the_run_with_everything_pending(
        tmp_path: Path, sandbox_factory, monkeypatch, caplog):
    accounts = tmp_path / "accounts.yaml"
    accounts.write_text(yaml.safe_dump({"accounts": {"team": {"balance": 10.0, "keys": [
        {"key": KEY, "models": [ALLOWED]}]}}}))
    sb = sandbox_factory(key=None, balance=None, args=["--accounts", str(accounts)])
    corpus, out = tmp_path / "corpus.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": [f"doc-{i}" for i in range(DOCS)],
                             "text": [f"document {i} about moving a corpus to a new model" for i in range(DOCS)]}),
                   corpus)
    monkeypatch.setenv("EMBEDDINGS_API_KEY", KEY)
    with caplog.at_level(logging.ERROR):
        code = run("--input", str(corpus), "--output", str(out), "--model", RUN_MODEL, "--base-url", sb.base_url,
                   "--max-in-flight", "2")
    assert code == 1
    s = summary(out)
    assert s["exit_code"] == 1 and s["embedded"] == 0 and s["failed"] == 0
    assert s["pending"] == DOCS and s["pending_reasons"] == {"forbidden": DOCS}
    pending = read_kind(out, "pending").to_pylist()
    assert sorted(r["doc_id"] for r in pending) == sorted(f"doc-{i}" for i in range(DOCS))
    assert {r["reason"] for r in pending} == {"forbidden"}
    assert read_kind(out, "embeddings").num_rows == 0
    # nothing paid: no charge, the balance untouched, and only 403s answered
    assert ledger(sb.db) == []
    balance = requests.get(f"{sb.base_url}/service/balance", headers={"Authorization": f"Bearer {KEY}"}, timeout=10)
    assert balance.json() == {"balance": 10.0}
    statuses = collections.Counter(r["status"] for r in read_kind(out, "requests").to_pylist())
    assert set(statuses) == {403} and statuses[403] <= 2
    # the message says why, naming the model and never the key
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any("forbidden" in m and "--resume" in m for m in errors), errors
    assert any("403" in m and RUN_MODEL in m and "not allowed" in m for m in errors), errors
    assert not any(KEY in m for m in errors)
    assert KEY not in (out / "summary.json").read_text()

"""`--resume` without `--input`: the last run's pending rows are sent, the corpus is not read."""
from __future__ import annotations

import collections

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import assert_passages, corpus_rows, current_rows, ledger, run, summary, write_corpus

MODEL = "text-embedding-3-small"


def test_resume_from_pending_rows_alone(tmp_path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0)
    corpus, out = write_corpus(tmp_path / "corpus.parquet"), tmp_path / "out"
    common = ["--output", str(out), "--model", MODEL, "--base-url", sb.base_url, "--keep-columns", "lang"]
    # a cap of about a third of the estimate: the long document's chunks wait in pending
    assert run("--input", str(corpus), *common, "--max-spend-rub", "0.015", "--allow-partial") == 4
    first_pending = current_rows(out, "pending")
    assert first_pending and {r["reason"] for r in first_pending} == {"budget_exhausted"}

    corpus.unlink()  # proof that the corpus is not read again
    assert run(*common, "--resume") == 0
    s = summary(out)
    assert s["pending"] == 0 and s["embedded"] == len(first_pending)
    emb, failed = current_rows(out, "embeddings"), current_rows(out, "failed")
    assert current_rows(out, "pending") == []
    # every row of the corpus is in exactly one current file, kept columns carried through
    keys = collections.Counter((r["doc_id"], r["chunk_index"], r["token_start"]) for r in emb)
    assert max(keys.values()) == 1
    good = {r["id"] for r in corpus_rows() if r["id"] and (r["text"] or "").strip() and r["id"] != "twice"}
    assert {r["doc_id"] for r in emb} == good
    assert {r["doc_id"] for r in failed} == {"null-text", "empty", "blank", "twice", None}
    assert all(r["lang"] for r in emb)
    assert_passages(out, {r["id"]: r["text"] for r in corpus_rows() if r["id"]})   # pending rows' text, sent
    sent = collections.Counter(h for c in ledger(sb.db) for h in c["input_sha256"])
    assert max(sent.values()) == 1  # nothing paid twice


def test_resume_without_input_needs_a_view(tmp_path, sandbox_factory, monkeypatch, caplog):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0)
    code = run("--output", str(tmp_path / "empty"), "--model", MODEL, "--base-url", sb.base_url, "--resume")
    assert code == 2 and "holds none: pass --input" in caplog.text

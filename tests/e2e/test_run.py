"""`python -m pipeline run` end to end against a sandbox over real HTTP, real Parquet, real Beam."""
from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa
import pytest

from service.catalog import load_models
from service.sandbox.embedder import embed_text
from service.sandbox.launcher import SandboxProcess
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows, ledger, read_kind, run, summary, write_corpus
from transforms.read.split import SplitConfig, Splitter

MODEL = "text-embedding-3-small"


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory):
    """One job for the whole module: the checks below read its outputs."""
    tmp = tmp_path_factory.mktemp("clean")
    with SandboxProcess(tmp / "sb.db", key=SANDBOX_KEY, balance=1000.0) as sandbox, \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        corpus = write_corpus(tmp / "corpus.parquet")
        out = tmp / "out"
        code = run("--input", str(corpus), "--output", str(out), "--model", MODEL,
                   "--base-url", sandbox.base_url, "--keep-columns", "lang")
        yield code, out, sandbox


def test_every_row_is_accounted_for_once(clean_run):
    code, out, _ = clean_run
    assert code == 0
    emb, failed = read_kind(out, "embeddings"), read_kind(out, "failed")
    assert read_kind(out, "pending").num_rows == 0
    reasons = {(r["doc_id"], r["reason"]) for r in failed.to_pylist()}
    assert reasons == {("null-text", "null_text"), ("empty", "empty_text"), ("blank", "empty_text"),
                       ("twice", "duplicate_id"), (None, "null_id")}
    assert failed.num_rows == 6  # both "twice" rows fail
    rows = corpus_rows()
    good = {r["id"] for r in rows if r["id"] and r["text"] and r["text"].strip() and r["id"] != "twice"}
    per_doc = collections.Counter(emb.column("doc_id").to_pylist())
    assert set(per_doc) == good
    counts = {d: c for d, c in zip(emb.column("doc_id").to_pylist(), emb.column("chunk_count").to_pylist(), strict=True)}
    assert all(per_doc[d] == counts[d] for d in good)
    assert per_doc["long-1"] > 1


def test_chunks_are_exact_and_vectors_match_the_service(clean_run):
    _, out, _ = clean_run
    emb = read_kind(out, "embeddings").to_pylist()
    enc, limit = get_encoding(), load_models()[MODEL].chunk_tokens
    splitter = Splitter(enc, SplitConfig(max_tokens=limit))
    texts = {r["id"]: r["text"] for r in corpus_rows() if r["id"]}
    by_doc = collections.defaultdict(list)
    for row in emb:
        by_doc[row["doc_id"]].append(row)
    for doc_id, doc_rows in by_doc.items():
        doc_rows.sort(key=lambda r: (r["chunk_index"], r["token_start"]))
        chunks = splitter.split(doc_id, texts[doc_id])
        assert "".join(c.text for c in chunks) == texts[doc_id]
        assert [c.text_sha256 for c in chunks] == [r["text_sha256"] for r in doc_rows]
        for chunk, row in zip(chunks, doc_rows, strict=True):
            assert row["text"] == chunk.text   # the passage beside its vector: what was sent for it
            assert row["n_tokens"] == len(enc.encode_ordinary(chunk.text)) <= limit
            expected = embed_text(MODEL, chunk.text, 1536)
            np.testing.assert_array_equal(np.asarray(row["embedding"], dtype=np.float32), expected)


def test_schema_is_the_contract(clean_run):
    _, out, _ = clean_run
    emb = read_kind(out, "embeddings")
    assert emb.schema.names == ["doc_id", "chunk_index", "chunk_count", "token_start", "token_end",
                                "n_tokens", "text_sha256", "text", "model", "embedding", "request_id",
                                "cost_rub", "run_id", "embedded_at", "lang"]
    assert emb.schema.field("embedding").type == pa.list_(pa.field("item", pa.float32(), nullable=False), 1536)
    assert emb.schema.field("embedded_at").type == pa.timestamp("us", tz="UTC")
    meta = emb.schema.metadata
    assert meta[b"model"] == MODEL.encode() and meta[b"tokenizer"] == b"cl100k_base" and b"run_id" in meta
    assert read_kind(out, "requests").schema.names == [
        "request_id", "model", "n_inputs", "prompt_tokens", "total_tokens", "cost_rub", "balance_after",
        "attempts", "latency_ms", "status", "started_at", "run_id"]
    assert read_kind(out, "failed").schema.names == ["doc_id", "chunk_index", "reason", "detail", "run_id"]


def test_costs_reconcile_with_the_ledger_to_the_micro_rouble(clean_run):
    _, out, sandbox = clean_run
    emb, req = read_kind(out, "embeddings"), read_kind(out, "requests")
    charges = ledger(sandbox.db)
    micro = lambda values: sum(round(v * 1e6) for v in values)
    assert micro(emb.column("cost_rub").to_pylist()) == micro(req.column("cost_rub").to_pylist()) \
        == micro(c["cost_rub"] for c in charges)
    assert sorted(req.column("request_id").to_pylist()) == sorted(c["request_id"] for c in charges)
    s = summary(out)
    assert s["reconciliation"]["balance_minus_requests_rub"] == 0
    assert s["reconciliation"]["rows_minus_requests_rub"] == 0
    # the shared text was sent once and its vector fanned out to both rows
    sent = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert max(sent.values()) == 1
    for name in ("run_id", "model", "documents", "chunks", "embedded", "failed", "pending", "requests",
                 "prompt_tokens", "cost_rub", "balance_before", "balance_after", "stats_before",
                 "stats_after", "reconciliation", "files"):
        assert name in s
    assert s["documents"] == len(corpus_rows())

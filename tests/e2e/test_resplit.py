"""Re-splitting: the service counts more tokens than the client thought (a model whose real
tokenizer is not cl100k_base), answers 400 context_length_exceeded, and the job splits the
chunk further and sends the pieces - no failed rows, and the pieces still describe the document.

The sandbox's --token-skew text-embedding-v4=1.3 counts ceil(1.3 n) tokens: a full chunk of
floor(8192 x 0.95) = 7782 client tokens is 10117 > 8192 for the service.
"""
from __future__ import annotations

from itertools import pairwise
import collections
import hashlib
import math
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from service.catalog import load_models
from service.sandbox.embedder import embed_text
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, WORDS_RU, ledger, paragraph, read_kind, run, summary
from transforms.read.split import SplitConfig, Splitter

MODEL = "text-embedding-v4"
SKEW = 1.3
SPEC = load_models()[MODEL]
REPO = Path(__file__).resolve().parents[2]


def service_tokens(n_client_tokens: int) -> int:
    return math.ceil(n_client_tokens * SKEW)


@pytest.fixture(scope="module")
def corpus() -> dict[str, str]:
    rng = random.Random(13)
    docs = {f"long-{i}": "\n\n".join(paragraph(rng, WORDS_EN + WORDS_RU, 120) for _ in range(60 + 25 * i))
            for i in range(4)}
    docs.update({f"short-{i}": paragraph(rng, WORDS_EN, 30 + i) for i in range(6)})
    return docs


def test_over_length_chunks_are_resplit_not_failed(tmp_path, sandbox_factory, monkeypatch, corpus):
    assert service_tokens(SPEC.chunk_tokens) > SPEC.max_input_tokens  # the premise
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--token-skew", f"{MODEL}={SKEW}"])
    path, out = tmp_path / "corpus.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": list(corpus), "text": list(corpus.values())}), path)
    code = run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url)
    assert code == 0
    assert all(read_kind(out, k) is None or read_kind(out, k).num_rows == 0 for k in ("failed", "pending"))

    enc = get_encoding()
    chunks = {d: Splitter(enc, SplitConfig(max_tokens=SPEC.chunk_tokens)).split(d, t) for d, t in corpus.items()}
    too_long = [c for cs in chunks.values() for c in cs if service_tokens(c.n_tokens) > SPEC.max_input_tokens]
    assert len(too_long) >= 8

    requests = read_kind(out, "requests").to_pylist()
    statuses = collections.Counter(r["status"] for r in requests)
    print(f"\nresplit: {len(too_long)} over-length chunks, requests by status {dict(statuses)}")
    # Each over-length chunk is refused at least once (alone, after bisecting its batch).
    assert statuses[400] >= len(too_long) and set(statuses) == {200, 400}
    assert all(r["cost_rub"] == 0 for r in requests if r["status"] == 400)

    rows = read_kind(out, "embeddings").to_pylist()
    by_doc = collections.defaultdict(list)
    for r in rows:
        by_doc[r["doc_id"]].append(r)
    assert set(by_doc) == set(corpus)
    resplit_chunks = 0
    for doc_id, doc_rows in by_doc.items():
        doc_rows.sort(key=lambda r: (r["chunk_index"], r["token_start"]))
        expected = chunks[doc_id]
        assert sorted({r["chunk_index"] for r in doc_rows}) == list(range(len(expected)))
        assert {r["chunk_count"] for r in doc_rows} == {len(expected)}
        texts = []
        for chunk in expected:
            pieces = [r for r in doc_rows if r["chunk_index"] == chunk.chunk_index]
            resplit_chunks += len(pieces) > 1
            assert (len(pieces) > 1) == (chunk in too_long)
            # The pieces tile the chunk's token span, in order.
            assert pieces[0]["token_start"] == chunk.token_start and pieces[-1]["token_end"] == chunk.token_end
            assert all(a["token_end"] == b["token_start"] for a, b in pairwise(pieces))
            piece_texts = piece_texts_of(chunk.text, pieces, enc)
            assert "".join(piece_texts) == chunk.text
            for piece, text in zip(pieces, piece_texts, strict=True):
                assert piece["text"] == text   # each piece's row carries the piece that was sent
                assert piece["text_sha256"] == hashlib.sha256(text.encode()).hexdigest()
                assert piece["n_tokens"] == len(enc.encode_ordinary(text))
                assert service_tokens(piece["n_tokens"]) <= SPEC.max_input_tokens  # within the service's limit
                np.testing.assert_array_equal(np.asarray(piece["embedding"], np.float32),
                                              embed_text(MODEL, text, SPEC.dimensions))
            texts += piece_texts
        assert "".join(texts) == corpus[doc_id]  # pieces in (chunk_index, token_start) order rebuild it
    assert resplit_chunks == len(too_long)

    # The money still adds up: rows to requests, requests to the ledger (the 400s cost nothing).
    micro = lambda values: sum(round(v * 1e6) for v in values)
    charges = ledger(sb.db)
    assert micro(r["cost_rub"] for r in rows) == micro(r["cost_rub"] for r in requests) \
        == micro(c["cost_rub"] for c in charges)
    assert all(c["prompt_tokens"] <= SPEC.max_tokens_per_request for c in charges)
    assert summary(out)["reconciliation"]["balance_minus_requests_rub"] == 0


def piece_texts_of(chunk_text: str, pieces: list[dict], enc) -> list[str]:
    """The pieces' texts, recomputed from the chunk via their token spans: the chunk's tokens
    from each piece's start (relative to the chunk) for its n_tokens, decoded."""
    tokens = enc.encode_ordinary(chunk_text)
    first = pieces[0]["token_start"]
    return [enc.decode(tokens[p["token_start"] - first:p["token_end"] - first]) for p in pieces]


def test_requests_over_the_services_caps_are_bisected(tmp_path, sandbox_factory, monkeypatch, corpus):
    """A catalogue that promises more than the service takes (40 inputs where it allows 10):
    400 too_many_inputs, the batch is halved until it passes; nothing fails, nothing is paid twice."""
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    doc = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    doc["models"][MODEL]["max_inputs_per_request"] = 40
    models = tmp_path / "models.yaml"
    models.write_text(yaml.safe_dump(doc))
    rng = random.Random(5)
    ids = [f"s{i}" for i in range(60)]
    path, out = tmp_path / "corpus.parquet", tmp_path / "out"
    pq.write_table(pa.table({"id": ids, "text": [f"{i} " + paragraph(rng, WORDS_EN, 10) for i in range(60)]}), path)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0)
    code = run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--models-config", str(models))
    assert code == 0
    assert all(read_kind(out, k) is None or read_kind(out, k).num_rows == 0 for k in ("failed", "pending"))
    rows = read_kind(out, "embeddings").to_pylist()
    assert sorted(r["doc_id"] for r in rows) == sorted(ids)
    requests = read_kind(out, "requests").to_pylist()
    refused = [r for r in requests if r["status"] == 400]
    assert refused and all(r["n_inputs"] > SPEC.max_inputs_per_request for r in refused)
    assert all(r["n_inputs"] <= SPEC.max_inputs_per_request for r in requests if r["status"] == 200)
    sent = collections.Counter(h for c in ledger(sb.db) for h in c["input_sha256"])
    assert len(sent) == len(ids) and set(sent.values()) == {1}

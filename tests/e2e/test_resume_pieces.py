"""A chunk the service made us re-split can end up partly delivered and partly pending;
`--resume` must send exactly the pieces still missing."""
from __future__ import annotations

from itertools import pairwise
import collections
import random

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, current_rows, ledger, paragraph, run, write_corpus

MODEL = "text-embedding-v4"


def test_partly_delivered_chunk_is_completed_by_resume(tmp_path, sandbox_factory, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    rng = random.Random(5)
    text = " ".join(paragraph(rng, WORDS_EN, 60) for _ in range(110))  # one chunk of ~7000 tokens
    corpus = write_corpus(tmp_path / "c.parquet", [{"id": "long", "text": text, "lang": "en"}])
    out = tmp_path / "out"
    # the service counts 2.5x the client's tokens: the chunk is re-split into pieces, and the
    # run's cap runs out after some of them
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--token-skew", f"{MODEL}=2.5"])
    common = ["--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url]
    assert run(*common, "--max-spend-rub", "0.1", "--allow-partial") == 4
    assert current_rows(out, "embeddings") and current_rows(out, "pending")
    assert run(*common, "--resume") == 0
    rows = sorted(current_rows(out, "embeddings"), key=lambda r: r["token_start"])
    assert current_rows(out, "pending") == [] and current_rows(out, "failed") == []
    assert {r["chunk_index"] for r in rows} == {0}
    assert rows[0]["token_start"] == 0
    assert all(a["token_end"] == b["token_start"] for a, b in pairwise(rows))  # pieces tile the chunk
    assert sum(r["n_tokens"] for r in rows) == rows[-1]["token_end"]
    sent = collections.Counter(h for c in ledger(sb.db) for h in c["input_sha256"])
    assert max(sent.values()) == 1  # no piece paid twice

"""Streaming dedupe (transforms/dedupe/distinct.py): a text is sent once even when its second row comes
long after the first was sent. Such a late row gets a copy of the first row's outcome: its
vector and request id at cost 0 (re-split pieces included), or its pending row."""
from __future__ import annotations

import collections
import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, WORDS_RU, ledger, paragraph, read_kind, run, summary

MODEL = "text-embedding-v4"  # 10 inputs per request: the first requests leave early


@pytest.fixture
def corpus(tmp_path):
    rng = random.Random(5)
    long_text = "\n\n".join(paragraph(rng, WORDS_EN + WORDS_RU, 120) for _ in range(90))
    rows = [{"id": "long-a", "text": long_text, "lang": "mixed"},
            {"id": "short-a", "text": "the very first short text", "lang": "en"}]
    rows += [{"id": f"mid-{i}", "text": paragraph(rng, WORDS_EN, 10 + i % 7), "lang": "en"} for i in range(80)]
    rows += [{"id": "long-b", "text": long_text, "lang": "late"},
             {"id": "short-b", "text": "the very first short text", "lang": "late"}]
    path = tmp_path / "corpus.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=16)
    return path, rows


def _by_doc(table: pa.Table) -> dict:
    rows = collections.defaultdict(list)
    for r in table.to_pylist():
        rows[r["doc_id"]].append(r)
    return {d: sorted(rs, key=lambda r: (r["chunk_index"], r["token_start"])) for d, rs in rows.items()}


def test_late_duplicates_are_paid_once_and_copied(tmp_path, sandbox_factory, monkeypatch, corpus):
    path, rows = corpus
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--token-skew", f"{MODEL}=1.3"])
    out = tmp_path / "out"
    assert run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--keep-columns", "lang") == 0
    charges = ledger(sb.db)
    sent = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert sent and max(sent.values()) == 1, "a text was paid twice"

    emb = _by_doc(read_kind(out, "embeddings"))
    assert set(emb) == {r["id"] for r in rows}
    for first, late in (("long-a", "long-b"), ("short-a", "short-b")):
        a, b = emb[first], emb[late]
        assert len(a) == len(b) and len(a) >= 1
        for x, y in zip(a, b, strict=True):
            same = ("chunk_index", "chunk_count", "token_start", "token_end", "n_tokens", "text_sha256",
                    "request_id", "embedding")
            assert {k: x[k] for k in same} == {k: y[k] for k in same}
            assert y["lang"] == "late" and x["lang"] != "late"
            assert y["cost_rub"] == 0 and x["cost_rub"] > 0  # the first row paid
    assert len(emb["long-a"]) > len({r["chunk_index"] for r in emb["long-a"]}), "expected re-split pieces"

    cost = lambda t: round(sum(t.column("cost_rub").to_pylist()) * 1e6)
    assert cost(read_kind(out, "embeddings")) == cost(read_kind(out, "requests")) == \
        round(sum(c["cost_rub"] for c in charges) * 1e6)
    s = summary(out)
    assert s["exit_code"] == 0 and s["embedded"] == sum(len(v) for v in emb.values())
    assert s["metrics"]["chunks_deduplicated"] >= 2
    assert not (out / "_progress").exists() and not (out / "_journal").exists()
    late = list(out.glob("current/embeddings-*-late-*.parquet"))
    name = f"history/{s['run_id']}/embeddings-{s['run_id']}-late-00000-of-00001.parquet"
    assert len(late) == 1 and name in s["files"]
    main = [f for f in out.glob("current/embeddings-*.parquet") if f not in late]
    assert pq.read_schema(late[0]) == pq.read_schema(main[0])  # required columns, metadata: as written


def test_late_duplicates_of_pending_rows_are_pending(tmp_path, sandbox_factory, monkeypatch, corpus):
    path, rows = corpus
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0)
    out = tmp_path / "out"
    assert run("--input", str(path), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
               "--keep-columns", "lang", "--max-spend-rub", "0.000001") == 3
    assert ledger(sb.db) == []
    pending = _by_doc(read_kind(out, "pending"))
    assert set(pending) == {r["id"] for r in rows}
    assert [r["text"] for r in pending["short-b"]] == ["the very first short text"]
    assert {r["reason"] for rs in pending.values() for r in rs} == {"estimate_exceeds_budget"}
    assert [r["token_start"] for r in pending["long-b"]] == [r["token_start"] for r in pending["long-a"]]
    assert np.all([r["lang"] == "late" for r in pending["long-b"]])

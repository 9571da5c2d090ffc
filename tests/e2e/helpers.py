"""Shared by the end-to-end tests: a small corpus with every kind of row, and output readers."""
from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.cli import main
from pipeline.outdir.layout import kind_of
from service.sandbox.store import read_ledger

WORDS_EN = ("parquet beam pipeline vector budget token rouble request worker shard cloud batch "
            "schema column embedding service latency retry journal ledger balance").split()
WORDS_RU = "данные вектор бюджет запрос модель текст поиск рубль строка колонка".split()


def paragraph(rng: random.Random, words, n: int) -> str:
    return " ".join(rng.choice(words) for _ in range(n)).capitalize() + "."


def corpus_rows(seed: int = 1) -> list[dict]:
    rng = random.Random(seed)
    rows = [{"id": f"en-{i}", "text": paragraph(rng, WORDS_EN, 5 + i * 3), "lang": "en"} for i in range(12)]
    rows += [{"id": f"ru-{i}", "text": paragraph(rng, WORDS_RU, 8 + i), "lang": "ru"} for i in range(6)]
    rows.append({"id": "code-1", "text": "def f(x):\n    return x * 2\n\nprint(f(21))\n", "lang": "code"})
    long_text = "\n\n".join(paragraph(rng, WORDS_EN + WORDS_RU, 300) for _ in range(40))
    rows.append({"id": "long-1", "text": long_text, "lang": "mixed"})
    rows.append({"id": "dup-text-a", "text": rows[0]["text"], "lang": "en"})  # same text, new id
    rows.append({"id": "special", "text": "<|endoftext|>", "lang": "en"})
    rows += [{"id": "null-text", "text": None, "lang": "en"}, {"id": "empty", "text": "", "lang": "en"},
             {"id": "blank", "text": " \n\t ", "lang": "en"},
             {"id": "twice", "text": "first of two rows", "lang": "en"},
             {"id": "twice", "text": "second of two rows", "lang": "en"},
             {"id": None, "text": "a row without id", "lang": "en"}]
    return rows


def write_corpus(path: Path, rows: list[dict] | None = None) -> Path:
    rows = corpus_rows() if rows is None else rows
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("lang", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def run(*args: str) -> int:
    return main(["run", *args])


def read_kind(out: Path, kind: str) -> pa.Table:
    """The rows of KIND in DIR's current view, read as a glob reader does (DIR/current/)."""
    files = sorted((out / "current").glob(f"{kind}-*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default") if files else pa.table({})


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def ledger(db) -> list[dict]:
    return list(read_ledger(str(db)))


def current_files(out: Path, kind: str) -> list[Path]:
    """The files of KIND that summary.json lists as DIR's current view."""
    return [out / f for f in summary(out)["files"] if kind_of(f) == kind]


def current_rows(out: Path, kind: str) -> list[dict]:
    """The rows of KIND in the files summary.json lists as DIR's current view."""
    return [row for f in current_files(out, kind) for row in pq.read_table(f).to_pylist()]


def assert_passages(out: Path, corpus: dict[str, str | None], *, overlap: bool = False) -> int:
    """Every embeddings row of DIR's current view carries the text that was sent for its vector:
    its sha256 is the row's text_sha256, and a document's rows (with its pending ones), in order,
    are slices of its text in CORPUS (id -> text), which they make up whole when the document has
    no failed chunk and chunks do not overlap. Returns the rows checked."""
    rows = [dict(r, kind="embeddings") for r in current_rows(out, "embeddings")]
    rows += [dict(r, kind="pending") for r in current_rows(out, "pending")]
    failed = {r["doc_id"] for r in current_rows(out, "failed") if r["chunk_index"] is not None}
    by_doc: dict[str, list[dict]] = {}
    for r in rows:
        assert r["text"] is not None, f"{r['kind']} row {r['doc_id']}/{r['chunk_index']} has no text"
        assert hashlib.sha256(r["text"].encode("utf-8")).hexdigest() == r["text_sha256"], r
        by_doc.setdefault(r["doc_id"], []).append(r)
    for doc_id, doc_rows in by_doc.items():
        text, at = corpus[doc_id], 0
        assert text is not None
        for r in sorted(doc_rows, key=lambda r: (r["chunk_index"], r["token_start"])):
            found = text.find(r["text"], 0 if overlap else at)
            assert found >= 0 and (overlap or doc_id in failed or found == at), (doc_id, r["chunk_index"], at, found)
            at = found + len(r["text"])
        assert overlap or doc_id in failed or at == len(text), (doc_id, at, len(text))
    return len(rows)

"""Arrow schemas of the outputs (design.md, "Contract: outputs")."""
from __future__ import annotations

import json
from typing import Sequence

import pyarrow as pa

UTC_MICROS = pa.timestamp("us", tz="UTC")

CHUNK_FIELDS = [
    pa.field("doc_id", pa.string()),
    pa.field("chunk_index", pa.int32()),
    pa.field("chunk_count", pa.int32()),
    pa.field("token_start", pa.int32()),
    pa.field("token_end", pa.int32()),
    pa.field("n_tokens", pa.int32()),
    pa.field("text_sha256", pa.string()),
    pa.field("model", pa.string()),
]

REQUESTS = pa.schema([
    pa.field("request_id", pa.string()),
    pa.field("model", pa.string()),
    pa.field("n_inputs", pa.int32()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("total_tokens", pa.int64()),
    pa.field("cost_rub", pa.float64()),
    pa.field("balance_after", pa.float64()),
    pa.field("attempts", pa.int32()),
    pa.field("latency_ms", pa.float64()),
    pa.field("status", pa.int32()),
    pa.field("started_at", UTC_MICROS),
    pa.field("run_id", pa.string()),
])

FAILED = pa.schema([
    pa.field("doc_id", pa.string()),
    pa.field("chunk_index", pa.int32()),
    pa.field("reason", pa.string()),
    pa.field("detail", pa.string()),
    pa.field("run_id", pa.string()),
])


def metadata(model: str, dimensions: int | None, run_id: str) -> dict[bytes, bytes]:
    return {b"model": model.encode(), b"dimensions": str(dimensions or "").encode(),
            b"tokenizer": b"cl100k_base", b"run_id": run_id.encode(),
            b"embedpipe": json.dumps({"model": model, "dimensions": dimensions}).encode()}


def embeddings(dimensions: int, kept: Sequence[pa.Field], meta: dict[bytes, bytes]) -> pa.Schema:
    return pa.schema([
        *CHUNK_FIELDS,
        pa.field("embedding", pa.list_(pa.float32(), dimensions)),
        pa.field("request_id", pa.string()),
        pa.field("cost_rub", pa.float64()),
        pa.field("run_id", pa.string()),
        pa.field("embedded_at", UTC_MICROS),
        *kept,
    ], metadata=meta)


def pending(kept: Sequence[pa.Field], meta: dict[bytes, bytes]) -> pa.Schema:
    return pa.schema([*CHUNK_FIELDS, pa.field("text", pa.string()), pa.field("reason", pa.string()),
                      pa.field("run_id", pa.string()), *kept], metadata=meta)


# Every column name the outputs use: a kept input column may not take one of them.
OUTPUT_COLUMNS = frozenset(
    [f.name for f in CHUNK_FIELDS] + REQUESTS.names + FAILED.names
    + ["embedding", "request_id", "cost_rub", "run_id", "embedded_at", "text", "reason"])

"""Arrow schemas of the outputs (design.md, "Contract: outputs").

Every column the contract guarantees is declared required, and so are the vector's elements:
readers can rely on them, and engines such as ClickHouse refuse vector functions on
Array(Nullable(Float32)). Nullable are only what can be missing: failed.doc_id (a null id),
failed.chunk_index (a whole document), requests.balance_after (a server that does not report
it), and kept input columns, which keep the input's nullability.

`text` in the embeddings files is the chunk's exact text, what was sent for its vector (its
sha256 is `text_sha256`): a search shows the passage without going back to the corpus. Left
out with `output.chunk_text: false`; a view written before it held no text has files without
the column, until a run that reads their documents gives their rows their text."""
from __future__ import annotations

import copyreg
import json
from collections.abc import Sequence

import pyarrow as pa

UTC_MICROS = pa.timestamp("us", tz="UTC")


def required(name: str, type_: pa.DataType) -> pa.Field:
    return pa.field(name, type_, nullable=False)


def vector_type(dimensions: int) -> pa.DataType:
    """fixed_size_list<float32 not null>[DIMENSIONS]: no element of a vector is ever missing."""
    return pa.list_(required("item", pa.float32()), dimensions)


def _fixed_size_list(value_field: pa.Field, size: int) -> pa.DataType:
    return pa.list_(value_field, size)


# pyarrow pickles a FixedSizeListType as list_(value_type, size), dropping the element field's
# nullability, and Beam pickles these schemas into its sinks. Keep the whole field; rebuilding
# through this module imports it, so a worker that pickles the sink again keeps it too.
copyreg.pickle(pa.FixedSizeListType, lambda t: (_fixed_size_list, (t.value_field, t.list_size)))


CHUNK_FIELDS = [
    required("doc_id", pa.string()),
    required("chunk_index", pa.int32()),
    required("chunk_count", pa.int32()),
    required("token_start", pa.int32()),
    required("token_end", pa.int32()),
    required("n_tokens", pa.int32()),
    required("text_sha256", pa.string()),
    required("model", pa.string()),
]

REQUESTS = pa.schema([
    required("request_id", pa.string()),
    required("model", pa.string()),
    required("n_inputs", pa.int32()),
    required("prompt_tokens", pa.int64()),
    required("total_tokens", pa.int64()),
    required("cost_rub", pa.float64()),
    pa.field("balance_after", pa.float64()),
    required("attempts", pa.int32()),
    required("latency_ms", pa.float64()),
    required("status", pa.int32()),
    required("started_at", UTC_MICROS),
    required("run_id", pa.string()),
])

FAILED = pa.schema([
    pa.field("doc_id", pa.string()),
    pa.field("chunk_index", pa.int32()),
    required("reason", pa.string()),
    required("detail", pa.string()),
    required("run_id", pa.string()),
])


def metadata(model: str, dimensions: int | None, run_id: str) -> dict[bytes, bytes]:
    return {b"model": model.encode(), b"dimensions": str(dimensions or "").encode(),
            b"tokenizer": b"cl100k_base", b"run_id": run_id.encode(),
            b"embedpipe": json.dumps({"model": model, "dimensions": dimensions}).encode()}


TEXT = "text"


def embeddings(dimensions: int, kept: Sequence[pa.Field], meta: dict[bytes, bytes], text: bool = True) -> pa.Schema:
    """TEXT: with the chunk's text, beside its digest."""
    at = [f.name for f in CHUNK_FIELDS].index("text_sha256") + 1
    return pa.schema([
        *CHUNK_FIELDS[:at],
        *([required(TEXT, pa.string())] if text else []),
        *CHUNK_FIELDS[at:],
        required("embedding", vector_type(dimensions)),
        required("request_id", pa.string()),
        required("cost_rub", pa.float64()),
        required("run_id", pa.string()),
        required("embedded_at", UTC_MICROS),
        *kept,
    ], metadata=meta)


def pending(kept: Sequence[pa.Field], meta: dict[bytes, bytes]) -> pa.Schema:
    return pa.schema([*CHUNK_FIELDS, required(TEXT, pa.string()), required("reason", pa.string()),
                      required("run_id", pa.string()), *kept], metadata=meta)


# Every column name the outputs use: a kept input column may not take one of them.
OUTPUT_COLUMNS = frozenset(
    [f.name for f in CHUNK_FIELDS] + REQUESTS.names + FAILED.names
    + ["embedding", "request_id", "cost_rub", "run_id", "embedded_at", TEXT, "reason"])

"""Output rows with cost lineage: each row's share of its request's cost, to the micro-rouble.

A request's cost is apportioned over its inputs by tokens (largest remainder), and an input's
share again over the rows that share that text, so the rows of a request sum exactly to the
cost the service reported. Each row carries the text that was sent for its vector (the item's:
a row that shares a text, or reuses its vector, has the same text) when its schema has `text`.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence

import numpy as np
import pyarrow as pa

from transforms.money.apportion import apportion_micro, from_micro
from transforms.records import ChunkRef, TextItem
from transforms.schemas import TEXT


def _ref_columns(refs: Sequence[ChunkRef], shas: Sequence[str], model: str,
                 kept: Sequence[pa.Field]) -> dict[str, pa.Array]:
    cols = {
        "doc_id": pa.array([r.doc_id for r in refs], pa.string()),
        "chunk_index": pa.array([r.chunk_index for r in refs], pa.int32()),
        "chunk_count": pa.array([r.chunk_count for r in refs], pa.int32()),
        "token_start": pa.array([r.token_start for r in refs], pa.int32()),
        "token_end": pa.array([r.token_end for r in refs], pa.int32()),
        "n_tokens": pa.array([r.n_tokens for r in refs], pa.int32()),
        "text_sha256": pa.array(shas, pa.string()),
        "model": pa.array([model] * len(refs), pa.string()),
    }
    for i, field in enumerate(kept):
        cols[field.name] = pa.array([r.kept[i] for r in refs], field.type)
    return cols


def embeddings_table(items: Sequence[TextItem], vectors: np.ndarray, request_ids: Sequence[str | None],
                     shares_micro: Sequence[int], schema: pa.Schema, model: str, run_id: str,
                     kept: Sequence[pa.Field], embedded_at: dt.datetime) -> pa.Table:
    """One row per (text, row sharing it); ITEM i has VECTORS[i], REQUEST_IDS[i], SHARES_MICRO[i]."""
    refs: list[ChunkRef] = []
    shas, texts, costs, rows_of_item, req = [], [], [], [], []
    for i, item in enumerate(items):
        refs += item.refs
        shas += [item.text_sha256] * len(item.refs)
        texts += [item.text] * len(item.refs)
        req += [request_ids[i]] * len(item.refs)
        costs += apportion_micro(shares_micro[i], [1] * len(item.refs))
        rows_of_item += [i] * len(item.refs)
    n = len(refs)
    # a text shared by several rows repeats its vector; otherwise (the usual case) no copy
    one_each = all(len(item.refs) == 1 for item in items)
    rows = vectors if one_each else vectors[np.asarray(rows_of_item, dtype=np.int64)]
    flat = np.ascontiguousarray(rows, dtype=np.float32).reshape(-1)
    cols = _ref_columns(refs, shas, model, kept)
    if TEXT in schema.names:
        cols[TEXT] = pa.array(texts, pa.string())
    cols.update({
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(flat, pa.float32()),
                                                       type=schema.field("embedding").type),
        "request_id": pa.array(req, pa.string()),
        "cost_rub": pa.array([from_micro(c) for c in costs], pa.float64()),
        "run_id": pa.array([run_id] * n, pa.string()),
        "embedded_at": pa.array([embedded_at] * n, schema.field("embedded_at").type),
    })
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)


def pending_table(pending: Iterable[tuple[TextItem, str]], schema: pa.Schema, model: str,
                  run_id: str, kept: Sequence[pa.Field]) -> pa.Table:
    refs: list[ChunkRef] = []
    shas, texts, reasons = [], [], []
    for item, reason in pending:
        refs += item.refs
        shas += [item.text_sha256] * len(item.refs)
        texts += [item.text] * len(item.refs)
        reasons += [reason] * len(item.refs)
    cols = _ref_columns(refs, shas, model, kept)
    cols.update({TEXT: pa.array(texts, pa.string()), "reason": pa.array(reasons, pa.string()),
                 "run_id": pa.array([run_id] * len(refs), pa.string())})
    return pa.Table.from_arrays([cols[f.name] for f in schema], schema=schema)

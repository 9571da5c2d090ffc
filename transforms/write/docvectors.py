"""--doc-vectors: one vector per document, the token-weighted mean of its chunk vectors,
re-normalised. Written only for documents whose chunks were all embedded in this run."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa

from transforms.schemas import required, vector_type


def documents_schema(dims: int, meta: dict) -> pa.Schema:
    return pa.schema([required("doc_id", pa.string()), required("chunk_count", pa.int32()),
                      required("n_tokens", pa.int64()), required("model", pa.string()),
                      required("embedding", vector_type(dims)), required("run_id", pa.string())],
                     metadata=meta)


def _chunk_vectors(table: pa.Table):
    dims = table.schema.field("embedding").type.list_size
    vectors = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(-1, dims)
    cols = zip(*(table.column(c).to_pylist() for c in ("doc_id", "chunk_index", "chunk_count", "n_tokens")), strict=True)
    for i, (doc_id, chunk_index, chunk_count, n_tokens) in enumerate(cols):
        yield doc_id, (chunk_index, chunk_count, n_tokens, vectors[i].tobytes())


def document_vector(grouped, model: str, run_id: str):
    doc_id, parts = grouped
    parts = list(parts)
    if len({p[0] for p in parts}) == parts[0][1]:  # else a chunk failed or is pending
        yield _mean_row(doc_id, parts, model, run_id)


def token_weighted_mean(n_tokens, vectors) -> np.ndarray:
    """The mean of VECTORS weighted by their N_TOKENS, re-normalised (float32)."""
    weights = np.asarray(n_tokens, dtype=np.float64)
    mean = weights @ np.stack(vectors).astype(np.float64) / max(weights.sum(), 1)
    norm = np.linalg.norm(mean)
    return (mean / norm if norm else mean).astype(np.float32)


def _mean_row(doc_id, parts, model: str, run_id: str) -> dict:
    vectors = [np.frombuffer(p[3], dtype=np.float32) for p in parts]
    return {"doc_id": doc_id, "chunk_count": parts[0][1], "n_tokens": sum(p[2] for p in parts), "model": model,
            "embedding": token_weighted_mean([p[2] for p in parts], vectors).tolist(), "run_id": run_id}


class DocumentVectors(beam.PTransform):
    """Embeddings tables -> one row dict per fully embedded document."""

    def __init__(self, model: str, run_id: str):
        super().__init__()
        self._model, self._run_id = model, run_id

    def expand(self, tables):
        return (tables
                | "ChunkVectors" >> beam.FlatMap(_chunk_vectors)
                | "GroupByDoc" >> beam.GroupByKey()
                | "MeanVector" >> beam.FlatMap(document_vector, self._model, self._run_id))

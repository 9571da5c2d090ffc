"""The baseline: what a careful script does without a pipeline (the OpenAI cookbook's recipe).

Each document is encoded with tiktoken and cut into slices of 8191 tokens, each slice decoded
back to text; the texts go out 100 per request, one request at a time, through the project's
client; the vectors are written to one Parquet file at the end.

    python -m tests.bench.baseline --input corpus.parquet --base-url URL --output out.parquet \
        --result result.json      (key from $EMBEDDINGS_API_KEY)
"""
from __future__ import annotations

import argparse
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.client import EmbeddingsClient
from service.credentials import ApiKey
from service.tokenizer import get_encoding

MAX_TOKENS = 8191
BATCH = 100


def chunk_texts(encoding, text: str) -> list[str]:
    tokens = encoding.encode_ordinary(text)
    return [encoding.decode(tokens[i:i + MAX_TOKENS]) for i in range(0, len(tokens), MAX_TOKENS)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--input", required=True)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", default="text-embedding-3-small")
    ap.add_argument("--output", required=True)
    ap.add_argument("--result", required=True)
    args = ap.parse_args(argv)
    encoding = get_encoding()
    table = pq.read_table(args.input, columns=["id", "text"])
    ids, chunk_ix, vectors = [], [], []
    requests = tokens = 0
    batch: list[tuple[str, int, str]] = []

    def flush(client):
        nonlocal requests, tokens
        result = client.embed(args.model, [t for _, _, t in batch])
        requests += 1
        tokens += result.usage.prompt_tokens
        ids.extend(d for d, _, _ in batch)
        chunk_ix.extend(i for _, i, _ in batch)
        vectors.append(result.vectors)
        batch.clear()

    with EmbeddingsClient(args.base_url, ApiKey(os.environ["EMBEDDINGS_API_KEY"])) as client:
        for doc_id, text in zip(table.column("id").to_pylist(), table.column("text").to_pylist(), strict=True):
            for i, chunk in enumerate(chunk_texts(encoding, text)):
                batch.append((doc_id, i, chunk))
                if len(batch) == BATCH:
                    flush(client)
        if batch:
            flush(client)
    matrix = np.concatenate(vectors)
    out = pa.table({"doc_id": pa.array(ids, pa.string()), "chunk_index": pa.array(chunk_ix, pa.int32()),
                    "embedding": pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)),
                                                                    matrix.shape[1])})
    pq.write_table(out, args.output, compression="zstd")
    with open(args.result, "w", encoding="utf-8") as fh:
        json.dump({"chunks": len(ids), "requests": requests, "prompt_tokens": tokens}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The fastest any client could be on this machine: the corpus's chunks, packed and encoded as
JSON before the clock starts, sent IN_FLIGHT at a time over keep-alive connections, answers
read but not parsed. What remains is the sandbox's own work (tokenising, embedding, billing)
and its waits, on the cores the client would share with it."""
from __future__ import annotations

import concurrent.futures as cf
import json
import time
from pathlib import Path

import pyarrow.parquet as pq
import requests

from service.tokenizer import get_encoding
from tests.bench.baseline import MAX_TOKENS


def packed_bodies(corpus: Path, model: str, max_inputs: int, max_tokens: int, fill: float = 0.95) -> list[bytes]:
    encoding = get_encoding()
    bodies, texts, tokens = [], [], 0

    def close():
        nonlocal texts, tokens
        bodies.append(json.dumps({"model": model, "input": texts, "encoding_format": "base64"},
                                 ensure_ascii=False).encode())
        texts, tokens = [], 0

    for text in pq.read_table(corpus, columns=["text"]).column("text").to_pylist():
        ids = encoding.encode_ordinary(text)
        for start in range(0, len(ids), MAX_TOKENS):
            piece = ids[start:start + MAX_TOKENS]
            if texts and (len(texts) >= max_inputs or tokens + len(piece) > max_tokens * fill):
                close()
            texts.append(encoding.decode(piece))
            tokens += len(piece)
    if texts:
        close()
    return bodies


def send_all(base_url: str, key: str, bodies: list[bytes], in_flight: int) -> float:
    """Wall seconds to have every body answered (200 each)."""
    session = requests.Session()
    session.mount("http://", requests.adapters.HTTPAdapter(pool_maxsize=in_flight, max_retries=0))
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}

    def post(body: bytes) -> None:
        response = session.post(base_url + "/embeddings", data=body, headers=headers, timeout=300)
        response.raise_for_status()

    with cf.ThreadPoolExecutor(in_flight) as pool:
        started = time.perf_counter()
        for f in [pool.submit(post, b) for b in bodies]:
            f.result()
        wall = time.perf_counter() - started
    session.close()
    return wall

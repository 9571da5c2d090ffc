"""What a run did with its concurrency, read from its outputs and the sandbox: the requests in
flight over time (requests-*.parquet: started_at and latency_ms of each), the capacity 429s the
sandbox refused, and a digest of the rows delivered (the same digest = the same rows and
vectors)."""
from __future__ import annotations

import hashlib
import json
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.outdir.layout import kind_of

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _current(out: Path, kind: str) -> list[Path]:
    return [out / f for f in json.loads((out / "summary.json").read_text())["files"] if kind_of(f) == kind]


def in_flight(out: Path) -> tuple[float, int]:
    """(mean over the span from the first request sent to the last answered, peak)."""
    t = pa.concat_tables([pq.read_table(f, columns=["started_at", "latency_ms"]) for f in _current(out, "requests")])
    starts = [s.timestamp() for s in t["started_at"].to_pylist()]
    events = sorted([(s, 1) for s in starts] + [(s + ms / 1000, -1) for s, ms in
                                                 zip(starts, t["latency_ms"].to_pylist(), strict=True)])
    now = peak = 0
    area, last = 0.0, events[0][0]
    for at, step in events:
        area += now * (at - last)
        now, last = now + step, at
        peak = max(peak, now)
    return area / max(1e-9, events[-1][0] - events[0][0]), peak


def refused(base_url: str) -> int:
    with _DIRECT.open(base_url.removesuffix("/v1") + "/healthz", timeout=10) as resp:
        return json.load(resp)["capacity"]["refused"]


def rows_digest(out: Path) -> str:
    """sha256 over every delivered row (doc_id, chunk_index, token span, text hash, vector), in
    key order."""
    t = pa.concat_tables([pq.read_table(f, columns=["doc_id", "chunk_index", "token_start", "text_sha256",
                                                    "embedding"]) for f in _current(out, "embeddings")])
    t = t.sort_by([("doc_id", "ascending"), ("chunk_index", "ascending"), ("token_start", "ascending")])
    h = hashlib.sha256()
    for name in ("doc_id", "chunk_index", "token_start", "text_sha256"):
        h.update("\x00".join(map(str, t[name].to_pylist())).encode())
    h.update(np.ascontiguousarray(t["embedding"].combine_chunks().flatten().to_numpy()).tobytes())
    return h.hexdigest()


def paid_twice(charges: list[dict]) -> int:
    """Texts billed more than once among CHARGES."""
    seen, twice = set(), 0
    for c in charges:
        for sha in c["input_sha256"]:
            twice += sha in seen
            seen.add(sha)
    return twice

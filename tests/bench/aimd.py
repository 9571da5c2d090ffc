"""The adaptive limit against a sandbox with an embeddings rate limit (429 + Retry-After).

The same workload (small requests from a pool of threads) three ways:
- fixed:    THREADS requests always in flight; the client retries 429s itself;
- adaptive: the same threads gated by ConcurrencyLimiter as the Embed step uses it: each 429
            reaches the limiter through the client's on_retry hook as it happens, and the
            request gives its place back until the others fit, then retries;
- bucket:   TokenBucketLimiter set to the quota, when the quota is known in advance.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import threading
import time

from service import errors
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey
from transforms.embed.quota import TokenBucketLimiter
from transforms.embed.ratelimit import IGNORED, OK, RATE_LIMITED, ConcurrencyLimiter


@dataclasses.dataclass
class AimdResult:
    mode: str
    requests: int
    failed: int
    rate_limited: int       # 429 answers seen
    wall_s: float
    final_limit: float | None = None
    decreases: int | None = None

    @property
    def rps(self) -> float:
        return self.requests / self.wall_s


class _Counter:
    def __init__(self):
        self._lock = threading.Lock()
        self.rate_limited = self.failed = 0

    def add(self, rate_limited: int = 0, failed: int = 0) -> None:
        with self._lock:
            self.rate_limited += rate_limited
            self.failed += failed


def _fixed_one(client, model, texts, counter, bucket=None):
    if bucket is not None:
        bucket.acquire()
    try:
        result = client.embed(model, texts)
        counter.add(rate_limited=result.attempts - 1)
    except errors.EmbeddingsError as exc:
        counter.add(rate_limited=exc.attempts - (exc.status != 429), failed=1)


def _adaptive(client, model, texts, counter, limiter: ConcurrencyLimiter):
    """As transforms/embed/send.py's _embed: the limiter hears every 429 through on_retry."""
    permit = limiter.acquire()

    def on_retry(status):
        if status == 429:
            counter.add(rate_limited=1)
            permit.rate_limited()

    try:
        result = client.embed(model, texts, on_retry=on_retry)
    except errors.EmbeddingsError as exc:
        counter.add(rate_limited=int(exc.status == 429), failed=1)
        permit.release(RATE_LIMITED if exc.status == 429 else IGNORED)
        return
    permit.release(OK, tokens=sum(len(t) for t in texts) // 4,
                   latency_s=result.latency_ms / 1000 if result.attempts == 1 else None)


MODES = ("fixed", "adaptive", "bucket")


def run_mode(mode: str, base_url: str, key: str, model: str, batches: list[list[str]], threads: int,
             quota_rps: float, quota_burst: float) -> AimdResult:
    counter = _Counter()
    limiter = ConcurrencyLimiter(min(4, threads), maximum=threads) if mode == "adaptive" else None
    bucket = (TokenBucketLimiter(quota_rps * 60, burst_s=quota_burst / quota_rps)
              if mode == "bucket" else None)
    retry = RetryPolicy(max_attempts=8, max_total_s=120)
    with EmbeddingsClient(base_url, ApiKey(key), retry=retry, pool_size=threads) as client, \
            cf.ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        futures = [pool.submit(_adaptive, client, model, b, counter, limiter) if limiter else
                   pool.submit(_fixed_one, client, model, b, counter, bucket) for b in batches]
        for f in futures:
            f.result()
        wall = time.perf_counter() - started
    return AimdResult(mode, len(batches) - counter.failed, counter.failed, counter.rate_limited, wall,
                      limiter.limit if limiter else None, limiter.decreases if limiter else None)

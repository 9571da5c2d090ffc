"""The AIMD effect against a sandbox with an embeddings rate limit (429 + Retry-After).

The same workload (small requests from a pool of threads) three ways:
- fixed:  THREADS requests always in flight; the client retries 429s itself;
- aimd-hook:    the same threads gated by AimdLimiter; each 429 reaches the limiter as it
                happens and the request retries with the client's backoff, keeping its slot
                (what an on_retry hook in the client would give the Embed step);
- aimd-release: the same, but the request gives its slot back while it waits out Retry-After;
- bucket: TokenBucketLimiter set to the quota, when the quota is known in advance.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import random
import threading
import time

from service import errors
from service.client import EmbeddingsClient, RetryPolicy, backoff_delay
from service.credentials import ApiKey
from transforms.ratelimit import IGNORED, OK, RATE_LIMITED, AimdLimiter, TokenBucketLimiter


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


def _aimd_hook(client, model, texts, counter, limiter: AimdLimiter, policy: RetryPolicy):
    """What an on_retry hook in the client gives: each 429 reaches the limiter as it happens
    and the request retries with the client's backoff, keeping its slot."""
    permit = limiter.acquire()
    for attempt in range(1, policy.max_attempts + 1):
        try:
            client.embed(model, texts)
        except errors.RateLimitError as exc:
            counter.add(rate_limited=1)
            permit.rate_limited()
            if attempt < policy.max_attempts:
                time.sleep(backoff_delay(policy, attempt, exc.retry_after, random.random()))
            continue
        except errors.EmbeddingsError:
            break
        permit.release(OK)
        return
    counter.add(failed=1)
    permit.release(IGNORED)


def _aimd_release(client, model, texts, counter, limiter: AimdLimiter, policy: RetryPolicy):
    """The client does not retry 429s: the request gives its slot back while it waits out
    Retry-After (a sleeping request is not in flight), then queues for one again."""
    for attempt in range(1, policy.max_attempts + 1):
        permit = limiter.acquire()
        try:
            client.embed(model, texts)
        except errors.RateLimitError as exc:
            counter.add(rate_limited=1)
            permit.release(RATE_LIMITED)
            if attempt < policy.max_attempts:
                time.sleep(backoff_delay(policy, attempt, exc.retry_after, random.random()))
            continue
        except errors.EmbeddingsError:
            permit.release(IGNORED)
            break
        permit.release(OK)
        return
    counter.add(failed=1)


MODES = ("fixed", "aimd-hook", "aimd-release", "bucket")


def run_mode(mode: str, base_url: str, key: str, model: str, batches: list[list[str]], threads: int,
             quota_rps: float, quota_burst: float) -> AimdResult:
    counter = _Counter()
    policy = RetryPolicy(max_attempts=8, max_total_s=120)
    limiter = AimdLimiter(threads, minimum=1, maximum=threads) if mode.startswith("aimd") else None
    bucket = (TokenBucketLimiter(quota_rps * 60, burst_s=quota_burst / quota_rps)
              if mode == "bucket" else None)
    # with a limiter, 429s come back to our loop (the client makes one attempt)
    retry = dataclasses.replace(policy, max_attempts=1) if limiter else policy
    one = {"aimd-hook": _aimd_hook, "aimd-release": _aimd_release}.get(mode)
    with EmbeddingsClient(base_url, ApiKey(key), retry=retry, pool_size=threads) as client, \
            cf.ThreadPoolExecutor(threads) as pool:
        started = time.perf_counter()
        futures = [pool.submit(one, client, model, b, counter, limiter, policy) if one else
                   pool.submit(_fixed_one, client, model, b, counter, bucket) for b in batches]
        for f in futures:
            f.result()
        wall = time.perf_counter() - started
    return AimdResult(mode, len(batches) - counter.failed, counter.failed, counter.rate_limited, wall,
                      limiter.limit if limiter else None, limiter.decreases if limiter else None)

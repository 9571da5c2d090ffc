"""Draws docs/in-flight-limit.png: the adaptive in-flight limit over time against a service
whose capacity changes, for docs/scale.md.

    python -m tests.bench.limit_picture [--out docs/in-flight-limit.png]

A discrete-event simulation (no real time, no sandbox): one worker process that always has a
full request ready, its ConcurrencyLimiter (transforms/embed/ratelimit.py) exactly as the job
runs it, against a service that works on CAPACITY requests at once, the capacity moving
8 -> 4 -> 12 during the run. Top: a service that queues what is over its capacity (latency
grows); bottom: one that refuses it with 429 and Retry-After 1 s. Needs matplotlib (the
`report` extra).
"""
from __future__ import annotations

import argparse
import collections
import heapq
import random
from pathlib import Path

from transforms.embed.ratelimit import OK, RATE_LIMITED, ConcurrencyLimiter

FULL, COST = 280_000, 5_600_000          # tokens and micro-roubles of a full request
SERVICE_S, RETRY_AFTER_S, NOISE = 1.0, 1.0, 0.1
CAPACITY = ((0.0, 8), (90.0, 4), (180.0, 12))   # (from second, capacity)
END_S = 300.0


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def capacity_at(t: float) -> int:
    return [c for start, c in CAPACITY if start <= t][-1]


def simulate(mode: str, seed: int = 1) -> tuple[list, list, list]:
    """(time, limit) at every change, (time, in flight), and the times of 429s."""
    rng, clock = random.Random(seed), Clock()
    lim = ConcurrencyLimiter(2, maximum=32, admitted_after_s=0.25, clock=clock)
    events, seq = [], 0
    busy, queue, out = 0, collections.deque(), 0
    limits, in_flight, refusals, retries = [(0.0, lim.limit)], [(0.0, 0)], [], 0

    def push(t, kind, data=None):
        nonlocal seq
        heapq.heappush(events, (t, seq, kind, data))
        seq += 1

    def start(req):
        nonlocal busy
        busy += 1
        push(clock.now + SERVICE_S * rng.uniform(1 - NOISE, 1 + NOISE), "done", req)

    def send():
        nonlocal out, retries
        while clock.now < END_S and (p := lim.acquire(timeout=0)) is not None:
            retries = max(0, retries - 1)
            req = (p, clock.now)
            if busy < capacity_at(clock.now):
                start(req)
                out += 1
            elif mode == "queue":
                queue.append(req)
                out += 1
            else:
                refusals.append(clock.now)
                p.release(RATE_LIMITED)
                retries += 1
                push(clock.now + RETRY_AFTER_S, "tick")
                break
        if lim.paced_until > clock.now:
            push(lim.paced_until, "tick")

    push(0.0, "tick")
    for i in range(1, 9):                          # the callers look again while they wait
        push(i * 0.25, "tick")
    while events:
        clock.now, _, kind, data = heapq.heappop(events)
        if kind == "done":
            busy -= 1
            out -= 1
            while queue and busy < capacity_at(clock.now):
                start(queue.popleft())
            permit, sent_at = data
            permit.release(OK, tokens=FULL, latency_s=clock.now - sent_at, cost=COST)
        send()
        if kind == "tick" and mode == "queue":       # a capacity that grew takes the queue
            while queue and busy < capacity_at(clock.now):
                start(queue.popleft())
        limits.append((clock.now, lim.limit))
        in_flight.append((clock.now, out))
    return limits, in_flight, refusals


def draw(path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 1, figsize=(8, 5.2), sharex=True, dpi=80)
    cap_t = [t for t, _ in CAPACITY] + [END_S]
    cap_v = [c for _, c in CAPACITY] + [CAPACITY[-1][1]]
    for ax, mode, title in zip(axes, ("queue", "429"),
                               ("a service that queues past its capacity", "a service that refuses past it (429)"), strict=True):
        limits, in_flight, refusals = simulate(mode)
        ax.step(cap_t, cap_v, where="post", color="black", linestyle="--", linewidth=1.2, label="capacity")
        ax.step(*zip(*limits, strict=True), where="post", color="tab:blue", linewidth=1.4, label="in-flight limit")
        ax.step(*zip(*in_flight, strict=True), where="post", color="tab:orange", linewidth=0.6, alpha=0.6,
                label="requests out (queued or worked on)")
        if refusals:
            ax.plot(refusals, [0.4] * len(refusals), "|", color="tab:red", markersize=8,
                    label=f"429 ({len(refusals)})")
        ax.set_title(title, fontsize=10)
        ax.set_ylabel("requests")
        ax.set_ylim(0, 26)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8, ncol=2)
    axes[-1].set_xlabel("seconds (answers take 1 s ±10% when not queued)")
    fig.suptitle("One worker process's in-flight limit, simulated (tests/bench/limit_picture.py)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parents[2] / "docs" / "in-flight-limit.png"))
    draw(Path(ap.parse_args(argv).out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

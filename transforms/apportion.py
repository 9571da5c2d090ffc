"""Cost lineage to the micro-rouble (1e-6 RUB, the service's billing precision).

Shares are whole micro-roubles apportioned by largest remainder, so they always sum exactly to
the total: no float drift, no negative share, ties broken by position (deterministic).
"""
from __future__ import annotations

from typing import Sequence

MICRO = 1_000_000


def to_micro(rub: float) -> int:
    return round(rub * MICRO)


def from_micro(micro: int) -> float:
    return micro / MICRO


def apportion_micro(total_micro: int, weights: Sequence[int]) -> list[int]:
    if total_micro < 0:
        raise ValueError("cannot apportion a negative amount")
    if not weights:
        if total_micro:
            raise ValueError("nothing to apportion a non-zero amount over")
        return []
    if any(w < 0 for w in weights):
        raise ValueError("weights must be non-negative")
    weights = list(weights) if sum(weights) > 0 else [1] * len(weights)
    whole = sum(weights)
    shares = [total_micro * w // whole for w in weights]
    remainders = [total_micro * w % whole for w in weights]
    left = total_micro - sum(shares)
    for i in sorted(range(len(weights)), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return shares

"""Cost lineage in integer micro-roubles (1 micro = 1e-6 RUB, the service's billing unit).

Sums are done on integers so that the rows of a request add up exactly to its cost; floats
appear only at the edges (the service's usage.cost_rub in, Parquet float64 out).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

MICRO_PER_RUB = 1_000_000


def to_micro(rub: float) -> int:
    """Nearest micro-rouble: round(rub * 1e6) (Python's round, ties to even). An amount the
    service billed, round(x, 6), maps back to its exact micro count below 1e9 RUB, where the
    float error of the product stays well under half a micro."""
    if not math.isfinite(rub):
        raise ValueError(f"not a finite amount of roubles: {rub!r}")
    return round(rub * MICRO_PER_RUB)


def from_micro(micro: int) -> float:
    """The float closest to micro / 1e6; to_micro(from_micro(m)) == m below 1e9 RUB."""
    return micro / MICRO_PER_RUB


def bill_micro(total_tokens: int, price_per_token_rub: float) -> int:
    """What the service bills a request of TOTAL_TOKENS: round(tokens x price, 6) RUB, in
    micro-roubles. Rounding the RUB amount to 6 places is not rounding tokens x price x 1e6:
    the float product lands on either side of a half micro-rouble (1 token at 2.5 RUB per 1M
    bills 3, where the other rounding gives 2)."""
    return to_micro(round(total_tokens * price_per_token_rub, 6))


def apportion_micro(total_micro: int, weights: Sequence[int]) -> list[int]:
    """Split total_micro in proportion to weights by largest remainder: every share is the
    floor of its exact proportion or one more, the shares sum exactly to total_micro, and the
    micros left after flooring go to the largest remainders, the lower index first on a tie.
    All-zero weights split equally (same rule). Empty weights: [] for a total of 0."""
    if total_micro < 0:
        raise ValueError(f"total must be >= 0, got {total_micro}")
    if any(w < 0 for w in weights):
        raise ValueError("weights must be >= 0")
    if not weights:
        if total_micro:
            raise ValueError(f"cannot apportion {total_micro} micro over no weights")
        return []
    if not any(weights):
        weights = [1] * len(weights)
    whole = sum(weights)
    floors, remainders = zip(*(divmod(total_micro * w, whole) for w in weights), strict=True)
    shares = list(floors)
    left = total_micro - sum(shares)
    for i in sorted(range(len(shares)), key=lambda i: (-remainders[i], i))[:left]:
        shares[i] += 1
    return shares

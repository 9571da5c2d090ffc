"""Money at the edges is RUB (float); inside the sandbox it is integer micro-roubles, so sums
and balances never drift."""
from __future__ import annotations

MICRO = 1_000_000


def to_micro(rub: float) -> int:
    return round(rub * MICRO)


def from_micro(micro: int) -> float:
    return micro / MICRO


def cost_micro(total_tokens: int, price_per_token: float) -> int:
    # design.md's formula taken literally, round(total_tokens * price_per_token, 6) RUB, so a
    # client computing the same expression gets the same figure; then held as an exact integer.
    return to_micro(round(total_tokens * price_per_token, 6))

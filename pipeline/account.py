"""The driver's view of the account: balance, key budget and stats, before and after a run."""
from __future__ import annotations

import dataclasses

from service import errors
from service.client import EmbeddingsClient


@dataclasses.dataclass(frozen=True)
class Account:
    balance: float | None
    budget: float | None
    stats: dict | None

    def as_dict(self) -> dict:
        return {"balance": self.balance, "budget": self.budget, "stats": self.stats}


def read_account(client: EmbeddingsClient) -> Account:
    """Balance is required (auth and reachability errors propagate); stats are best effort."""
    bal = client.balance()
    try:
        st = client.stats()
        stats = {"daily_usage": st.daily_usage, "monthly_usage": st.monthly_usage}
    except errors.RateLimitError:
        stats = None
    return Account(bal.balance, bal.budget, stats)


def spendable(account: Account, reserve_rub: float, max_spend_rub: float | None) -> float:
    """min(balance - reserve, key budget when present, --max-spend-rub)."""
    limits = [max((account.balance or 0.0) - reserve_rub, 0.0)]
    if account.budget is not None:
        limits.append(account.budget)
    if max_spend_rub is not None:
        limits.append(max_spend_rub)
    return min(limits)

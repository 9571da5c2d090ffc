"""The driver's view of the account: balance, key budget and stats, before and after a run."""
from __future__ import annotations

import dataclasses
from typing import Any

from pipeline.terminal import hints
from service import errors
from service.client import EmbeddingsClient
from transforms.money.caps import BALANCE, KEY_BUDGET, MAX_SPEND, Caps, Spendable


@dataclasses.dataclass(frozen=True)
class Account:
    balance: float | None
    budget: float | None
    stats: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return {"balance": self.balance, "budget": self.budget, "stats": self.stats}


def read_account(client: EmbeddingsClient, need_stats: bool = False) -> Account:
    """Balance is required (auth and reachability errors propagate; a 404, the first answer of
    a mistyped --base-url, as a UsageError with the hint); stats are best effort unless
    NEED_STATS (spending caps). Balance first: usage read after it is never older."""
    try:
        bal = client.balance()
    except errors.NotFoundError as exc:   # the first request any command sends: a mistyped --base-url
        raise hints.not_found(client, exc) from None
    try:
        st = client.stats()
        stats = {"daily_usage": st.daily_usage, "monthly_usage": st.monthly_usage}
    except errors.RateLimitError:
        if need_stats:
            raise
        stats = None
    return Account(bal.balance, bal.budget, stats)


def spendable(account: Account, reserve_rub: float, max_spend_rub: float | None, caps: Caps = Caps()) -> Spendable:
    """min(balance - reserve, key budget when present, --max-spend-rub, daily cap - daily_usage,
    monthly cap - monthly_usage), never below 0; `plan` and `run` both take it from here."""
    limits = {BALANCE: max((account.balance or 0.0) - reserve_rub, 0.0)}
    if account.budget is not None:
        limits[KEY_BUDGET] = max(account.budget, 0.0)
    if max_spend_rub is not None:
        limits[MAX_SPEND] = max_spend_rub
    limits.update(caps.rooms(account.stats))
    return Spendable(limits, caps, account.stats)

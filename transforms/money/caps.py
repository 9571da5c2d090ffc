"""Account-wide spending caps per day and per 31 days, against the service's statistics.

`GET /service/stats` reports the whole account's spending, other clients included, in the
service's current day (`daily_usage`: the day by the service's clock and time zone, not the
launcher's) and in the last 31 days (`monthly_usage`). A cap lets this job spend only while
that figure stays under it.

Between two readings of the statistics (the endpoint is rate limited), the guard estimates
the account's usage under a cap as: the last reading + the larger of what this worker's
requests cost since and how far the account balance fell since. The balance in every
embeddings response is the account's shared counter, so other workers' and other clients'
spending shows there at once. A fresh reading replaces the estimate: when the service's day
turns over, `daily_usage` falls back, and the new day's room is used without counting the
old day's spending twice. Money is in integer micro-roubles, as in transforms/money/budget.py.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping

from service import errors
from service.client import EmbeddingsClient
from transforms.money.apportion import to_micro

log = logging.getLogger("embedpipe.caps")

# The names of the limits the spendable amount is the least of (plan --json: binding_limit).
BALANCE, KEY_BUDGET, MAX_SPEND = "balance", "key_budget", "max_spend_rub"
DAILY_CAP, MONTHLY_CAP = "daily_cap_rub", "monthly_cap_rub"
USAGE = {DAILY_CAP: "daily_usage", MONTHLY_CAP: "monthly_usage"}

# A guard about to give up on a cap waits out at most this much of a Retry-After for one
# fresh reading; beyond it, it gives up with the last figures (the rest stays pending).
FORCED_WAIT_MAX_S = 30.0


def _usage(stats: Mapping[str, float] | None, cap_name: str) -> float:
    """The account's usage under the cap CAP_NAME, from STATS."""
    if stats is None:
        raise ValueError("spending caps need the account's statistics")
    return stats[USAGE[cap_name]]


@dataclasses.dataclass(frozen=True)
class Caps:
    daily_cap_rub: float | None = None
    monthly_cap_rub: float | None = None

    def by_name(self) -> dict[str, float]:
        """The caps that are set, by limit name."""
        return {name: value for name, value in ((DAILY_CAP, self.daily_cap_rub),
                                                (MONTHLY_CAP, self.monthly_cap_rub)) if value is not None}

    def rooms(self, stats: Mapping[str, float] | None) -> dict[str, float]:
        """Room under each cap that is set: cap - the account's usage, never below 0."""
        return {name: max(cap - _usage(stats, name), 0.0) for name, cap in self.by_name().items()}


@dataclasses.dataclass(frozen=True)
class Spendable:
    """What may be spent: the least of LIMITS (name -> room in RUB when read). With caps set,
    also the CAPS and the account's STATS they were read against, which the in-run guard
    needs to keep honouring the caps while the account's usage moves (transforms/money/budget.py)."""
    limits: Mapping[str, float]
    caps: Caps = Caps()
    stats: Mapping[str, float] | None = None

    @property
    def rub(self) -> float:
        return min(self.limits.values())

    @property
    def binding(self) -> str:
        """The limit that binds (the first of the least, in the order they were given)."""
        return min(self.limits, key=self.limits.__getitem__)

    @property
    def without_caps(self) -> float:
        return min(v for k, v in self.limits.items() if k not in USAGE)

    def cap_usages(self, balance_rub: float | None) -> list[CapUsage]:
        """One CapUsage per cap that is set, from the statistics read with the limits."""
        return [CapUsage(name, cap, _usage(self.stats, name), balance_rub) for name, cap in self.caps.by_name().items()]


class CapUsage:
    """One cap and the guard's estimate of the account's usage under it (see the module doc)."""

    def __init__(self, name: str, cap_rub: float, usage_rub: float, balance_rub: float | None):
        self.name, self.cap = name, to_micro(cap_rub)
        self.rebase(to_micro(usage_rub), None if balance_rub is None else to_micro(balance_rub), 0)

    def rebase(self, usage: int, balance: int | None, settled: int) -> None:
        """A reading: USAGE, with the balance read just before it and what this worker's
        requests had cost (SETTLED) just before that."""
        self._usage, self._settled_at = usage, settled
        self._balance_at = self._lowest = balance

    def observe_balance(self, balance: int) -> None:
        if self._lowest is not None:
            self._lowest = min(self._lowest, balance)

    def room(self, settled: int) -> int:
        fell = 0 if self._balance_at is None or self._lowest is None else self._balance_at - self._lowest
        return self.cap - self._usage - max(settled - self._settled_at, fell)


@dataclasses.dataclass(frozen=True)
class AccountReading:
    balance: float
    budget: float | None
    stats: Mapping[str, float] | None   # None when not asked for or refused this time


class AccountWatch:
    """Reads the balance (and, with caps, then the statistics) at most every INTERVAL_S. A 429
    there is expected: the figures stay the last ones, and the next reading waits for its
    Retry-After. One reading at a time per worker process."""

    def __init__(self, client: EmbeddingsClient, interval_s: float, with_stats: bool,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self._client, self._interval, self._with_stats = client, interval_s, with_stats
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._due = 0.0          # the next periodic reading, clock time
        self._not_before = 0.0   # the last 429's Retry-After ends then
        self.throttled = 0       # 429s seen

    def read(self, force: bool = False) -> AccountReading | None:
        """A fresh reading, or None when none is due (FORCE: needed now) or the service refused."""
        with self._lock:
            now = self._clock()
            if not force and now < max(self._due, self._not_before):
                return None
            if now < self._not_before:
                if self._not_before - now > FORCED_WAIT_MAX_S:
                    return None
                self._sleep(self._not_before - now)
                now = self._clock()
            self._due = now + self._interval
            try:
                balance = self._client.balance()
            except errors.EmbeddingsError as exc:
                self._refused(exc, now)
                return None
            stats = None
            if self._with_stats:
                try:
                    st = self._client.stats()
                    stats = {"daily_usage": st.daily_usage, "monthly_usage": st.monthly_usage}
                except errors.EmbeddingsError as exc:
                    self._refused(exc, now)
            return AccountReading(balance.balance, balance.budget, stats)

    def _refused(self, exc: errors.EmbeddingsError, now: float) -> None:
        """Never fatal: the guard keeps the last figures (and every response carries the balance)."""
        if isinstance(exc, errors.RateLimitError):
            self.throttled += 1
            self._not_before = now + (exc.retry_after or self._interval)
            log.info("account endpoints rate limited (429); next reading in %.1f s", self._not_before - now)
        else:
            log.debug("account reading failed: %s", exc)
        return None

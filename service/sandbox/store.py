"""Accounts, keys and the ledger in SQLite.

WAL with synchronous=FULL: a charge is on disk before its answer is sent, so kill -9 (or a
power cut) loses no charge the client saw. Each charge checks and debits the balance and
the key budget and inserts its ledger row inside one BEGIN IMMEDIATE transaction.

Group commit: concurrent charges queue up; whichever thread finds no commit in progress
takes the whole queue and applies it in one transaction, charge after charge (each sees
the balance the previous one left), so many charges share one fsync. Writers are thus
serialised (no lost update) without paying an fsync each. Reads use their own connection
and see committed data only.

Money is integer micro-roubles. Keys are stored by fingerprint only, never by value.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from typing import Any
from zoneinfo import ZoneInfo

from .money import from_micro

_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (
    account TEXT PRIMARY KEY,
    balance_micro INTEGER NOT NULL CHECK (balance_micro >= 0)
);
CREATE TABLE IF NOT EXISTS keys (
    key_id TEXT PRIMARY KEY,
    account TEXT NOT NULL REFERENCES accounts(account),
    budget_micro INTEGER CHECK (budget_micro IS NULL OR budget_micro >= 0)
);
CREATE TABLE IF NOT EXISTS ledger (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL,
    account TEXT NOT NULL,
    key_id TEXT NOT NULL,
    model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    total_tokens INTEGER NOT NULL,
    cost_micro INTEGER NOT NULL,
    balance_after_micro INTEGER NOT NULL,
    input_sha256 TEXT NOT NULL,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS ledger_account_time ON ledger (account, created_at);
"""
# Fixed width, so text order is time order in SQL comparisons.
_TS_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"
_BALANCE_SQL = ("SELECT a.account, a.balance_micro, k.budget_micro FROM keys k JOIN accounts a USING (account)"
                " WHERE k.key_id = ?")


def utc_timestamp(when: dt.datetime) -> str:
    return when.astimezone(dt.UTC).strftime(_TS_FORMAT)


def _utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def offset_clock(path: str) -> Callable[[], dt.datetime]:
    """Real UTC time plus the seconds written in PATH, re-read at each use (no file: 0), so a
    test can move the service's day boundary while the sandbox runs (--clock-file)."""
    def now() -> dt.datetime:
        try:
            with open(path, encoding="utf-8") as fh:
                offset = float(fh.read().strip() or 0)
        except FileNotFoundError:
            offset = 0.0
        return _utc_now() + dt.timedelta(seconds=offset)
    return now


@dataclasses.dataclass(frozen=True)
class Charge:
    request_id: str
    key_id: str
    model: str
    prompt_tokens: int
    total_tokens: int
    cost_micro: int
    input_sha256: list[str]


@dataclasses.dataclass(frozen=True)
class ChargeResult:
    ok: bool
    balance_micro: int      # after the charge when ok, current otherwise
    refusal: str = ""       # "balance" or "budget" when not ok


class _Pending:
    __slots__ = ("charge", "result", "error")

    def __init__(self, charge: Charge):
        self.charge = charge
        self.result: ChargeResult | None = None
        self.error: BaseException | None = None


class Store:
    def __init__(self, path: str, clock: Callable[[], dt.datetime] = _utc_now):
        self._clock = clock
        self._write = self._connect(path)
        self._write.executescript(_SCHEMA)
        self._read = self._connect(path)
        self._read_lock = threading.Lock()
        self._cond = threading.Condition()
        self._queue: list[_Pending] = []
        self._committing = False

    @staticmethod
    def _connect(path: str) -> sqlite3.Connection:
        db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=30)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        return db

    def close(self) -> None:
        with self._cond:
            while self._committing:
                self._cond.wait()
            self._committing = True   # no commit after this
            self._write.close()
        with self._read_lock:
            self._read.close()

    def ensure_account(self, account: str, balance_micro: int) -> None:
        """Create ACCOUNT with its initial balance unless it exists: a restart keeps balances."""
        with self._cond:
            self._write.execute("INSERT OR IGNORE INTO accounts VALUES (?, ?)", (account, balance_micro))

    def ensure_key(self, key_id: str, account: str, budget_micro: int | None) -> None:
        with self._cond:
            self._write.execute("INSERT OR IGNORE INTO keys VALUES (?, ?, ?)", (key_id, account, budget_micro))

    def balance(self, key_id: str) -> tuple[int, int | None]:
        """(account balance, key budget or None), micro-roubles, as last committed."""
        with self._read_lock:
            _, balance, budget = self._read.execute(_BALANCE_SQL, (key_id,)).fetchone()
        return balance, budget

    def charge(self, c: Charge) -> ChargeResult:
        """Debit C.cost_micro from the key's account (and budget) and record it, or refuse when
        either would go below zero. Returns once the outcome is durable."""
        me = _Pending(c)
        with self._cond:
            self._queue.append(me)
            while me.result is None and me.error is None:
                if not self._committing:
                    self._committing, batch, self._queue = True, self._queue, []
                    break
                self._cond.wait()
            else:
                return self._outcome(me)
        try:
            self._commit(batch)
        finally:
            with self._cond:
                self._committing = False
                self._cond.notify_all()
        return self._outcome(me)

    @staticmethod
    def _outcome(p: _Pending) -> ChargeResult:
        if p.error is not None:
            raise p.error
        assert p.result is not None   # _commit sets one of the two
        return p.result

    def _commit(self, batch: list[_Pending]) -> None:
        db = self._write
        created_at = utc_timestamp(self._clock())
        results = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for p in batch:
                results.append(self._apply(db, p.charge, created_at))
            db.execute("COMMIT")
        except BaseException as exc:
            if db.in_transaction:
                db.execute("ROLLBACK")
            for p in batch:
                p.error = exc
            return
        for p, result in zip(batch, results, strict=True):
            p.result = result

    @staticmethod
    def _apply(db: sqlite3.Connection, c: Charge, created_at: str) -> ChargeResult:
        account, balance, budget = db.execute(_BALANCE_SQL, (c.key_id,)).fetchone()
        if c.cost_micro > balance:
            return ChargeResult(False, balance, "balance")
        if budget is not None and c.cost_micro > budget:
            return ChargeResult(False, balance, "budget")
        after = balance - c.cost_micro
        db.execute("UPDATE accounts SET balance_micro = ? WHERE account = ?", (after, account))
        if budget is not None:
            db.execute("UPDATE keys SET budget_micro = ? WHERE key_id = ?", (budget - c.cost_micro, c.key_id))
        db.execute(
            "INSERT INTO ledger (request_id, account, key_id, model, prompt_tokens, total_tokens,"
            " cost_micro, balance_after_micro, input_sha256, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (c.request_id, account, c.key_id, c.model, c.prompt_tokens, c.total_tokens, c.cost_micro, after,
             json.dumps(c.input_sha256), created_at))
        return ChargeResult(True, after)

    def usage(self, account: str, tz: ZoneInfo) -> tuple[int, int]:
        """(daily, monthly) spending in micro-roubles: since local midnight of today in TZ, and
        since local midnight 30 days earlier (today plus the 30 days before: 31 days)."""
        midnight = self._clock().astimezone(tz).replace(hour=0, minute=0, second=0, microsecond=0)
        day_start = utc_timestamp(midnight)
        month_start = utc_timestamp(midnight - dt.timedelta(days=30))   # wall-clock arithmetic in TZ
        with self._read_lock:
            daily, monthly = self._read.execute(
                "SELECT COALESCE(SUM(CASE WHEN created_at >= ? THEN cost_micro END), 0),"
                " COALESCE(SUM(cost_micro), 0) FROM ledger WHERE account = ? AND created_at >= ?",
                (day_start, account, month_start)).fetchone()
        return daily, monthly


def read_ledger(path: str) -> Iterator[dict[str, Any]]:
    """The ledger as design.md's records, in charge order; safe beside a running sandbox."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = db.execute(
            "SELECT request_id, key_id, model, prompt_tokens, total_tokens, cost_micro,"
            " balance_after_micro, input_sha256, created_at FROM ledger ORDER BY seq")
        for rid, key_id, model, prompt, total, cost, after, shas, created in rows:
            yield {"request_id": rid, "key_id": key_id, "model": model, "prompt_tokens": prompt,
                   "total_tokens": total, "cost_rub": from_micro(cost),
                   "balance_after": from_micro(after), "input_sha256": json.loads(shas),
                   "created_at": created}
    finally:
        db.close()

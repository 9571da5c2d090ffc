"""Command line, accounts file and fault profile of the sandbox, validated into one record."""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
from typing import Any
from collections.abc import Mapping
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import yaml

from service.catalog import ConfigError, ModelSpec, load_models
from service.credentials import key_fingerprint

from .capacity import MODES as CAPACITY_MODES, QUEUE
from .faults import FaultConfig
from .money import to_micro

DEFAULT_ACCOUNT = "default"
# Large enough for a full 300,000-token request of non-Latin text, which JSON-escapes to
# ~6 bytes per character; small enough to refuse a runaway body. --max-body-bytes changes it.
DEFAULT_MAX_BODY_BYTES = 16 * 1024 * 1024


@dataclasses.dataclass(frozen=True)
class KeySpec:
    value: str = dataclasses.field(repr=False)
    account: str
    budget_micro: int | None
    models: frozenset[str] | None = None   # the models the key may use; None: every catalogue model

    def allows(self, model: str) -> bool:
        return self.models is None or model in self.models

    @property
    def key_id(self) -> str:
        return key_fingerprint(self.value)

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.value.encode("utf-8")).digest()


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    host: str
    port: int
    db: str
    ready_file: str | None
    account_segment: str
    models: Mapping[str, ModelSpec]
    balances_micro: Mapping[str, int]           # initial balance per account (new accounts only)
    keys: tuple[KeySpec, ...]
    token_skew: Mapping[str, float]
    precheck: bool
    max_body_bytes: int
    account_rps: float
    account_burst: float
    tz: ZoneInfo
    clock_file: str | None
    faults: FaultConfig
    log_level: str
    capacity: int | None = None         # embeddings requests worked on at once per account
    capacity_mode: str = QUEUE          # past it: queue, or 429 with Retry-After
    capacity_retry_after_s: int = 1


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m service.sandbox",
        description="Local embeddings service (spec/service-api.md). "
                    "`python -m service.sandbox ledger --db PATH` prints the ledger.")
    p.add_argument("--host", default="127.0.0.1", help="bind address (loopback by default)")
    p.add_argument("--port", type=int, default=8780, help="0 lets the OS pick; see --ready-file")
    p.add_argument("--db", required=True, help="SQLite file with accounts and the ledger (kept across restarts)")
    p.add_argument("--ready-file", help='written as {"port": N, "pid": N} once serving')
    p.add_argument("--key", help="API key of the default account (a test key: argv is visible to ps)")
    p.add_argument("--balance", type=float, help="initial balance of the default account, RUB")
    p.add_argument("--budget", type=float, help="budget of --key, RUB (none by default)")
    p.add_argument("--key-models", metavar="MODEL[,MODEL...]",
                   help="the only models --key may use; others get 403 (default: every catalogue model)")
    p.add_argument("--accounts", help="YAML file with several accounts and keys (configs/sandbox/accounts.example.yaml)")
    p.add_argument("--account-segment", default="service", help="path segment of /v1/<segment>/balance|stats")
    p.add_argument("--models", help="model catalogue (default: the packaged configs/models.yaml)")
    p.add_argument("--token-skew", action="append", default=[], metavar="MODEL=FACTOR",
                   help="count ceil(n*FACTOR) tokens per input for MODEL (repeatable)")
    p.add_argument("--precheck", action="store_true",
                   help="refuse with 402 when the balance does not cover the estimate at the model's maximum context")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="larger bodies get 413")
    p.add_argument("--account-rps", type=float, default=5.0, help="balance/stats calls per second per key")
    p.add_argument("--account-burst", type=float, default=10.0, help="balance/stats burst per key")
    p.add_argument("--tz", default="UTC", help="time zone of the stats' day boundaries (IANA name)")
    p.add_argument("--clock-file", help="tests: the sandbox's clock is real time plus the seconds this "
                                        "file holds, re-read at each use (no file: 0)")
    p.add_argument("--capacity", type=int,
                   help="at most N embeddings requests per account worked on at once (default: no limit)")
    p.add_argument("--capacity-mode", choices=CAPACITY_MODES, default=QUEUE,
                   help="past --capacity: queue (latency grows, as an overloaded upstream's) or "
                        "429 (refused at once with Retry-After, not charged)")
    p.add_argument("--capacity-retry-after-s", type=int, default=1, help="Retry-After of the capacity 429s")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="DEBUG logs every request")
    p.add_argument("--control-stdin", action="store_true",
                   help='tests: each line of stdin, {"argv": [FLAG...], "log": PATH}, serves a new sandbox '
                        "of those flags on this port as a new process would start it (its own --db, "
                        "log, faults and rate limits); the end of stdin stops the server")
    f = p.add_argument_group("fault injection (flags override --faults)")
    f.add_argument("--faults", help="YAML fault profile (configs/sandbox/faults-*.yaml)")
    f.add_argument("--seed", type=int, help="seed of the fault draws (repeatable given the same request order)")
    f.add_argument("--latency-ms", type=float,
                   help="an embeddings answer leaves this long after its work began (the work included)")
    f.add_argument("--latency-per-token-us", type=float, help="and this much longer per token of the request")
    for name, kind, text in FaultConfig.FLAG_HELP:
        f.add_argument("--" + name.replace("_", "-"), type=kind, help=text)
    return p


def _money(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ConfigError(f"{where} must be a non-negative number of RUB, got {value!r}")
    return to_micro(float(value))


def _key_models(value: Any, models: Mapping[str, ModelSpec], where: str) -> frozenset[str]:
    """A key's allowed models: a non-empty list of catalogue ids (an empty list would leave a
    key that can embed nothing, more likely a mistake than an intent)."""
    if not isinstance(value, list) or not value or not all(isinstance(m, str) and m for m in value):
        raise ConfigError(f"{where} must be a non-empty list of model ids (leave it out for every model)")
    unknown = sorted(set(value) - set(models))
    if unknown:
        raise ConfigError(f"{where}: unknown model {', '.join(map(repr, unknown))}; known: {', '.join(sorted(models))}")
    return frozenset(value)


def load_accounts(path: str, models: Mapping[str, ModelSpec]) -> tuple[dict[str, int], list[KeySpec]]:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, Mapping) or not isinstance(doc.get("accounts"), Mapping):
        raise ConfigError(f"{path}: expected a top-level 'accounts' mapping")
    balances, keys = {}, []
    for name, raw in doc["accounts"].items():
        where = f"{path}: account {name!r}"
        if not isinstance(raw, Mapping) or not isinstance(raw.get("keys"), list) or not raw["keys"]:
            raise ConfigError(f"{where}: needs 'balance' and a non-empty 'keys' list")
        balances[str(name)] = _money(raw.get("balance"), f"{where}: balance")
        for i, k in enumerate(raw["keys"]):
            if not isinstance(k, Mapping) or not isinstance(k.get("key"), str) or not k["key"].strip():
                raise ConfigError(f"{where}: keys[{i}] needs a non-empty 'key'")
            budget = k.get("budget")
            allowed = None if "models" not in k else _key_models(k["models"], models, f"{where}: keys[{i}].models")
            keys.append(KeySpec(k["key"].strip(), str(name),
                                None if budget is None else _money(budget, f"{where}: keys[{i}].budget"), allowed))
    return balances, keys


def _skews(items: list[str], models: Mapping[str, ModelSpec]) -> dict[str, float]:
    out = {}
    for item in items:
        model, sep, factor = item.partition("=")
        try:
            value = float(factor)
        except ValueError:
            value = 0.0
        if not sep or model not in models or value <= 0:
            raise ConfigError(f"--token-skew {item!r}: expected MODEL=FACTOR with a known model and FACTOR > 0")
        out[model] = value
    return out


def config_from_args(args: argparse.Namespace) -> SandboxConfig:
    models = load_models(args.models)
    balances, keys = load_accounts(args.accounts, models) if args.accounts else ({}, [])
    if args.key is not None:
        if args.balance is None:
            raise ConfigError("--key needs --balance RUB")
        if not args.key.strip():
            raise ConfigError("--key is empty")
        if DEFAULT_ACCOUNT in balances:
            raise ConfigError(f"--accounts already defines the account {DEFAULT_ACCOUNT!r} used by --key")
        balances[DEFAULT_ACCOUNT] = _money(args.balance, "--balance")
        budget = None if args.budget is None else _money(args.budget, "--budget")
        allowed = None if args.key_models is None else _key_models(
            [m.strip() for m in args.key_models.split(",")], models, "--key-models")
        keys.append(KeySpec(args.key.strip(), DEFAULT_ACCOUNT, budget, allowed))
    elif args.balance is not None or args.budget is not None:
        raise ConfigError("--balance/--budget need --key")
    elif args.key_models is not None:
        raise ConfigError("--key-models needs --key")
    if not keys:
        raise ConfigError("no API key: give --key KEY --balance RUB, or --accounts FILE")
    ids = [k.key_id for k in keys]
    if len(set(ids)) != len(ids):
        raise ConfigError("the same key is configured twice")
    if not args.account_segment.strip("/") or "/" in args.account_segment.strip("/"):
        raise ConfigError("--account-segment must be one path segment")
    if args.max_body_bytes <= 0 or args.account_rps <= 0 or args.account_burst < 1:
        raise ConfigError("--max-body-bytes and --account-rps must be > 0, --account-burst >= 1")
    if (args.capacity is not None and args.capacity < 1) or args.capacity_retry_after_s < 0:
        raise ConfigError("--capacity must be >= 1 and --capacity-retry-after-s >= 0")
    try:
        tz = ZoneInfo(args.tz)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"--tz {args.tz!r}: unknown time zone") from None
    return SandboxConfig(
        host=args.host, port=args.port, db=args.db, ready_file=args.ready_file,
        account_segment=args.account_segment.strip("/"), models=models, balances_micro=balances,
        keys=tuple(keys), token_skew=_skews(args.token_skew, models), precheck=args.precheck,
        max_body_bytes=args.max_body_bytes, account_rps=args.account_rps,
        account_burst=args.account_burst, tz=tz, clock_file=args.clock_file, faults=FaultConfig.from_args(args),
        log_level=args.log_level, capacity=args.capacity, capacity_mode=args.capacity_mode,
        capacity_retry_after_s=args.capacity_retry_after_s)

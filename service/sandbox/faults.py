"""Seeded fault injection for embeddings requests.

Each embeddings request that passes authentication, rate limiting and validation draws one
number from a seeded RNG, so a run is repeatable given the same request order. The kinds:

  status_429, status_500, status_502, status_503   answer that status, charge nothing
  reset               close the socket with RST (SO_LINGER 0) before answering, charge nothing
  reset_after_charge  charge, then RST: the client cannot know it was billed
  slow                charge, then wait slow_s before answering (longer than a client's read
                      timeout): production bills work it has done even if the client left
Besides the draws: revoke_after N (every request with a key after its N-th embeddings
request gets 401, as if the key were deleted), and embeddings_rps/_burst (a per-key token
bucket on embeddings, 429 with Retry-After beyond it, for testing client-side AIMD).
"""
from __future__ import annotations

import argparse
import dataclasses
import random
import threading
from typing import Any
from collections.abc import Mapping

import yaml

from service.catalog import ConfigError

_RATE_KINDS = ("status_429", "status_500", "status_502", "status_503", "reset",
               "reset_after_charge", "slow")


@dataclasses.dataclass(frozen=True)
class FaultConfig:
    seed: int = 0
    latency_ms: float = 0.0
    latency_per_token_us: float = 0.0
    rate_429: float = 0.0
    retry_after_s: int = 1
    rate_500: float = 0.0
    rate_502: float = 0.0
    rate_503: float = 0.0
    rate_reset: float = 0.0
    rate_reset_after_charge: float = 0.0
    rate_slow: float = 0.0
    slow_s: float = 30.0
    revoke_after: int | None = None
    embeddings_rps: float | None = None
    embeddings_burst: float | None = None

    # (field, type, help) of the fault flags; --seed and the latencies are declared with the
    # design's own flags.
    FLAG_HELP = (
        ("rate_429", float, "share of embeddings requests answered 429 with Retry-After"),
        ("retry_after_s", int, "Retry-After seconds of the injected 429s"),
        ("rate_500", float, "share answered 500"),
        ("rate_502", float, "share answered 502"),
        ("rate_503", float, "share answered 503"),
        ("rate_reset", float, "share whose connection is reset before answering (not charged)"),
        ("rate_reset_after_charge", float, "share charged, then reset"),
        ("rate_slow", float, "share charged, then answered after --slow-s seconds"),
        ("slow_s", float, "delay of the slow answers, seconds"),
        ("revoke_after", int, "401 for a key after its N-th embeddings request"),
        ("embeddings_rps", float, "embeddings requests per second per key (429 beyond)"),
        ("embeddings_burst", float, "burst of --embeddings-rps (default: max(1, rps))"),
    )

    def __post_init__(self) -> None:
        rates = [getattr(self, "rate_" + k.removeprefix("status_")) for k in _RATE_KINDS]
        if any(r < 0 for r in rates) or sum(rates) > 1.0 + 1e-9:
            raise ConfigError(f"fault rates must be >= 0 and sum to at most 1, got {rates}")
        if self.latency_ms < 0 or self.latency_per_token_us < 0 or self.slow_s < 0 or self.retry_after_s < 0:
            raise ConfigError("latencies, slow_s and retry_after_s must be >= 0")
        if self.revoke_after is not None and self.revoke_after < 0:
            raise ConfigError("revoke_after must be >= 0")
        if self.embeddings_rps is not None and self.embeddings_rps <= 0:
            raise ConfigError("embeddings_rps must be > 0")

    @property
    def rates(self) -> tuple[tuple[str, float], ...]:
        return tuple((k, getattr(self, "rate_" + k.removeprefix("status_"))) for k in _RATE_KINDS)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str) -> FaultConfig:
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - set(fields))
        if unknown:
            raise ConfigError(f"{where}: unknown fault settings {unknown}; known: {sorted(fields)}")
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ConfigError(f"{where}: {name} must be a number, got {value!r}")
            if value is not None:   # a setting left empty keeps its default
                values[name] = value
        try:
            return cls(**values)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> FaultConfig:
        raw: dict[str, Any] = {}
        if args.faults:
            try:
                with open(args.faults, encoding="utf-8") as fh:
                    doc = yaml.safe_load(fh) or {}
            except OSError as exc:
                raise ConfigError(f"{args.faults}: cannot read: {exc.strerror}") from None
            except yaml.YAMLError as exc:
                raise ConfigError(f"{args.faults}: not valid YAML: {exc}") from None
            if not isinstance(doc, Mapping):
                raise ConfigError(f"{args.faults}: expected a mapping of fault settings")
            raw.update(doc)
        names = ["seed", "latency_ms", "latency_per_token_us"] + [n for n, _, _ in cls.FLAG_HELP]
        raw.update({n: getattr(args, n) for n in names if getattr(args, n, None) is not None})
        return cls.from_mapping(raw, args.faults or "fault flags")


class FaultInjector:
    def __init__(self, config: FaultConfig):
        self.config = config
        self._rng = random.Random(config.seed)
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self.injected: dict[str, int] = {k: 0 for k in (*_RATE_KINDS, "revoked")}

    def draw(self) -> str | None:
        """The fault for this request, or None. Exactly one RNG draw per call."""
        with self._lock:
            x = self._rng.random()
            for kind, rate in self.config.rates:
                if x < rate:
                    self.injected[kind] += 1
                    return kind
                x -= rate
            return None

    def admit_embeddings(self, key_id: str) -> bool:
        """Count an embeddings request by KEY_ID, unless its key is revoked by now: checked and
        counted in one step, so concurrent requests cannot both slip past the N-th."""
        limit = self.config.revoke_after
        with self._lock:
            seen = self._requests.get(key_id, 0)
            if limit is not None and seen >= limit:
                self.injected["revoked"] += 1
                return False
            self._requests[key_id] = seen + 1
            return True

    def revoked(self, key_id: str) -> bool:
        limit = self.config.revoke_after
        with self._lock:
            hit = limit is not None and self._requests.get(key_id, 0) >= limit
            if hit:
                self.injected["revoked"] += 1
            return hit

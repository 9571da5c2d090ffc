"""Typed run settings: configs/pipeline.yaml (or --run-config FILE), overridden by flags."""
from __future__ import annotations

import dataclasses
import math
from importlib import resources
from typing import Any
from collections.abc import Mapping

from service.catalog import ConfigError, parse_yaml_mapping
from transforms.read.split import MIN_MAX_TOKENS


@dataclasses.dataclass(frozen=True)
class ClientSettings:
    max_attempts: int = 6
    max_refusals: int = 20
    initial_backoff_s: float = 0.5
    max_backoff_s: float = 20.0
    max_total_s: float = 120.0
    jitter: float = 0.25
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 60.0
    read_timeout_max_s: float = 300.0
    pool_size: int = 32
    encoding_format: str = "base64"
    max_decoding: int = 2


@dataclasses.dataclass(frozen=True)
class SplitSettings:
    chunk_tokens: int | None = None    # None: the model's limit (ModelSpec.chunk_tokens)
    overlap_tokens: int = 0
    boundary_window: float = 0.1


@dataclasses.dataclass(frozen=True)
class OutputSettings:
    chunk_text: bool = True


@dataclasses.dataclass(frozen=True)
class PackSettings:
    fill_target: float = 0.99
    max_open_requests: int = 16


@dataclasses.dataclass(frozen=True)
class EmbedSettings:
    max_in_flight: int = 32
    initial_in_flight: int = 2
    admitted_after_s: float = 0.25
    max_refused_s: float = 900.0
    progress_interval_s: float = 5.0
    progress_redraw_s: float = 1.0


@dataclasses.dataclass(frozen=True)
class BudgetSettings:
    reserve_rub: float = 0.0
    price_margin: float = 1.25
    balance_poll_s: float = 5.0
    daily_cap_rub: float | None = None      # account-wide caps (transforms/money/caps.py); None: no cap
    monthly_cap_rub: float | None = None


@dataclasses.dataclass(frozen=True)
class RateLimitSettings:
    requests_per_minute: int = 0
    tokens_per_minute: int = 0


PARQUET_CODECS = ("none", "snappy", "gzip", "brotli", "lz4", "zstd")


@dataclasses.dataclass(frozen=True)
class WriteSettings:
    codec: str = "zstd"
    vector_codec: str = "none"


@dataclasses.dataclass(frozen=True)
class ViewSettings:
    keep: int = 3


@dataclasses.dataclass(frozen=True)
class CompareSettings:
    sample: int = 200
    k: int = 10
    pool: int = 5000
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class LockSettings:
    heartbeat_s: float = 10.0
    lease_s: float = 60.0


@dataclasses.dataclass(frozen=True)
class StoreSettings:
    refresh_s: float = 60.0
    compact_below_mb: int = 64


@dataclasses.dataclass(frozen=True)
class PublishSettings:
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    ef_search: int = 100
    maintenance_work_mem_mb: int = 1024
    parallel_index_workers: int = 1
    lock_timeout_ms: int = 500
    swap_attempts: int = 60
    swap_backoff_s: float = 1.0
    snapshot_wait_s: float = 300.0
    rerank_factor: int = 4
    lock_wait_s: float = 10.0
    connect_timeout_s: float = 10.0
    rebuild_share: float = 0.3
    fillfactor: int = 90
    launcher_rows: int = 10_000
    embedded_shared_buffers_mb: int = 1024
    text_search_config: str = "simple"


@dataclasses.dataclass(frozen=True)
class SearchSettings:
    rrf_k: int = 60
    leg_rows: int = 40
    text_rank_rows: int = 500


@dataclasses.dataclass(frozen=True)
class RunSettings:
    client: ClientSettings = ClientSettings()
    split: SplitSettings = SplitSettings()
    output: OutputSettings = OutputSettings()
    pack: PackSettings = PackSettings()
    embed: EmbedSettings = EmbedSettings()
    budget: BudgetSettings = BudgetSettings()
    rate_limits: RateLimitSettings = RateLimitSettings()
    write: WriteSettings = WriteSettings()
    views: ViewSettings = ViewSettings()
    lock: LockSettings = LockSettings()
    compare: CompareSettings = CompareSettings()
    store: StoreSettings = StoreSettings()
    publish: PublishSettings = PublishSettings()
    search: SearchSettings = SearchSettings()

    def replace(self, section: str, **changes: Any) -> RunSettings:
        return dataclasses.replace(self, **{section: dataclasses.replace(getattr(self, section), **changes)})


def _section(cls: type, raw: Any, where: str) -> Any:
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields.keys())
    if unknown:
        raise ConfigError(f"{where}: unknown setting(s) {unknown}; known: {sorted(fields)}")
    values = {}
    for name, value in raw.items():
        default = getattr(cls(), name)
        if default is None:  # optional: null (unset), a count, or a finite amount of RUB
            if value is None:
                continue
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"{where}.{name}: expected a finite amount >= 0 or null, got {value!r}")
            default = 0 if str(fields[name].type).startswith("int") else 0.0
        if isinstance(default, bool) or type(default) is str:
            ok = type(value) is type(default)
        else:  # numbers: an int is fine where a float is expected, never a bool
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0
            ok = ok and (isinstance(default, float) or isinstance(value, int))
        if not ok:
            raise ConfigError(f"{where}.{name}: expected a non-negative {type(default).__name__}, got {value!r}")
        values[name] = float(value) if isinstance(default, float) else value
    return cls(**values)


def parse_settings(text: str, where: str = "pipeline.yaml") -> RunSettings:
    doc = parse_yaml_mapping(text, where, "a mapping of sections")
    sections = {f.name: f.type for f in dataclasses.fields(RunSettings)}
    unknown = sorted(set(doc) - sections.keys())
    if unknown:
        raise ConfigError(f"{where}: unknown section(s) {unknown}; known: {sorted(sections)}")
    types = {f.name: type(f.default) for f in dataclasses.fields(RunSettings)}
    settings = RunSettings(**{name: _section(types[name], doc.get(name), f"{where}:{name}")
                              for name in sections})
    for name in ("codec", "vector_codec"):
        if getattr(settings.write, name).lower() not in PARQUET_CODECS:
            raise ConfigError(f"{where}:write.{name} must be one of {', '.join(PARQUET_CODECS)}")
    if settings.client.encoding_format not in ("base64", "float"):
        raise ConfigError(f"{where}:client.encoding_format must be base64 or float")
    if not 0 < settings.pack.fill_target <= 1:
        raise ConfigError(f"{where}:pack.fill_target must be in (0, 1]")
    positive = {"embed.max_in_flight": settings.embed.max_in_flight,
                "embed.initial_in_flight": settings.embed.initial_in_flight,
                "embed.admitted_after_s": settings.embed.admitted_after_s,
                "embed.max_refused_s": settings.embed.max_refused_s,
                "embed.progress_interval_s": settings.embed.progress_interval_s,
                "embed.progress_redraw_s": settings.embed.progress_redraw_s,
                "client.max_attempts": settings.client.max_attempts,
                "client.pool_size": settings.client.pool_size, "client.max_decoding": settings.client.max_decoding,
                "pack.max_open_requests": settings.pack.max_open_requests,
                "client.connect_timeout_s": settings.client.connect_timeout_s,
                "client.read_timeout_s": settings.client.read_timeout_s,
                "client.max_total_s": settings.client.max_total_s, "views.keep": settings.views.keep,
                "compare.sample": settings.compare.sample, "compare.k": settings.compare.k,
                "compare.pool": settings.compare.pool, "publish.hnsw_m": settings.publish.hnsw_m,
                "publish.hnsw_ef_construction": settings.publish.hnsw_ef_construction,
                "publish.ef_search": settings.publish.ef_search,
                "publish.maintenance_work_mem_mb": settings.publish.maintenance_work_mem_mb,
                "publish.swap_attempts": settings.publish.swap_attempts,
                "publish.rerank_factor": settings.publish.rerank_factor,
                "publish.lock_timeout_ms": settings.publish.lock_timeout_ms,
                "publish.connect_timeout_s": settings.publish.connect_timeout_s,
                "publish.embedded_shared_buffers_mb": settings.publish.embedded_shared_buffers_mb,
                "search.rrf_k": settings.search.rrf_k, "search.leg_rows": settings.search.leg_rows,
                "search.text_rank_rows": settings.search.text_rank_rows}
    if bad := [name for name, value in positive.items() if value <= 0]:
        raise ConfigError(f"{where}: {', '.join(bad)} must be > 0")
    if settings.client.read_timeout_max_s < settings.client.read_timeout_s:
        raise ConfigError(f"{where}:client.read_timeout_max_s must be >= client.read_timeout_s")
    if settings.budget.price_margin < 1:
        raise ConfigError(f"{where}:budget.price_margin must be >= 1 (it is a safety margin on the price)")
    if not 0 < settings.lock.heartbeat_s < settings.lock.lease_s:
        raise ConfigError(f"{where}:lock.heartbeat_s must be > 0 and below lock.lease_s")
    if settings.split.chunk_tokens is not None and settings.split.chunk_tokens < MIN_MAX_TOKENS:
        raise ConfigError(f"{where}:split.chunk_tokens must be null (the model's limit) or at least {MIN_MAX_TOKENS}")
    if not 0 <= settings.split.boundary_window <= 0.5:
        raise ConfigError(f"{where}:split.boundary_window must be between 0 and 0.5")
    if not 0 <= settings.publish.rebuild_share <= 1:
        raise ConfigError(f"{where}:publish.rebuild_share must be between 0 and 1")
    if settings.publish.launcher_rows < 0:
        raise ConfigError(f"{where}:publish.launcher_rows must be >= 0")
    if not 10 <= settings.publish.fillfactor <= 100:
        raise ConfigError(f"{where}:publish.fillfactor must be between 10 and 100 (PostgreSQL's bounds)")
    return settings


def default_settings_text() -> str:
    return resources.files("configs").joinpath("pipeline.yaml").read_text(encoding="utf-8")

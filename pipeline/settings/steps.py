"""What the embedding steps are given, built from configs/ in one place for the CLI's Job
(pipeline/settings/job.py) and the library (embedpipe/_config.py): the catalogue and the run
settings (read through Beam's FileSystems, so a gs:// or s3:// config works as a local one),
the retry policy, the service's config and the splitter's."""
from __future__ import annotations

from apache_beam.io.filesystems import FileSystems

from pipeline.settings.config import RunSettings, default_settings_text, parse_settings
from service.catalog import ConfigError, ModelSpec, load_models, parse_models
from service.client import RetryPolicy
from service.credentials import KeySource
from transforms.embed.config import ServiceConfig
from transforms.read.split import SplitConfig


def read_text(path: str) -> str:
    try:
        with FileSystems.open(path) as fh:
            return fh.read().decode("utf-8")
    except Exception as exc:
        raise ConfigError(f"{path}: cannot read ({exc})") from None


def catalogue(path: str | None) -> dict[str, ModelSpec]:
    """The model catalogue at PATH, or configs/models.yaml."""
    return parse_models(read_text(path), path) if path else load_models()


def run_settings(path: str | None) -> RunSettings:
    """The run settings at PATH, or configs/pipeline.yaml."""
    return parse_settings(read_text(path) if path else default_settings_text(), path or "configs/pipeline.yaml")


def retry_policy(settings: RunSettings) -> RetryPolicy:
    c = settings.client
    return RetryPolicy(max_attempts=c.max_attempts, max_refusals=c.max_refusals, initial_backoff_s=c.initial_backoff_s,
                       max_backoff_s=c.max_backoff_s, max_total_s=c.max_total_s, jitter=c.jitter,
                       connect_timeout_s=c.connect_timeout_s, read_timeout_s=c.read_timeout_s,
                       read_timeout_max_s=c.read_timeout_max_s)


def service_config(settings: RunSettings, model: ModelSpec, base_url: str, account_segment: str, keys: KeySource,
                   asked_dimensions: int | None) -> ServiceConfig:
    """How the Embed step reaches the service and how hard it presses it."""
    c, e, r = settings.client, settings.embed, settings.rate_limits
    return ServiceConfig(base_url, account_segment, keys, model.name, asked_dimensions,
                         asked_dimensions or model.dimensions, retry_policy(settings), c.pool_size, c.encoding_format,
                         c.max_decoding, e.max_in_flight, e.initial_in_flight, e.admitted_after_s, e.max_refused_s,
                         r.requests_per_minute, r.tokens_per_minute)


def split_config(settings: RunSettings, model: ModelSpec) -> SplitConfig:
    """The model's chunks, as the settings shape them (a ValueError names a bad number):
    split.chunk_tokens, at most the model's limit, or that limit."""
    s = settings.split
    if s.chunk_tokens is not None and s.chunk_tokens > model.chunk_tokens:
        raise ValueError(f"chunk_tokens must be at most {model.chunk_tokens} for {model.name} (its "
                         f"max_input_tokens x safety_factor), got {s.chunk_tokens}")
    return SplitConfig(max_tokens=s.chunk_tokens or model.chunk_tokens, overlap_tokens=s.overlap_tokens,
                       boundary_window=s.boundary_window)

"""The model catalogue: configs/models.yaml loaded into typed, validated records.

Shared by the sandbox (limits, prices) and the pipeline (splitting, packing, planning), so it
lives in service/, which imports no Beam.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
from importlib import resources
from typing import Any
from collections.abc import Mapping

import yaml


class ConfigError(ValueError):
    """A configuration file is missing, malformed or inconsistent; the message says where."""


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    name: str
    max_input_tokens: int
    tokenizer: str
    safety_factor: float
    max_inputs_per_request: int
    max_tokens_per_request: int
    dimensions: int
    supports_dimensions: bool
    price_rub_per_1m_tokens: float

    @property
    def chunk_tokens(self) -> int:
        """Largest chunk, in client-counted tokens, that is safe to send as one input."""
        return max(1, math.floor(self.max_input_tokens * self.safety_factor))

    @property
    def request_tokens(self) -> int:
        """Largest sum of client-counted tokens safe to send in one request."""
        return max(self.chunk_tokens, math.floor(self.max_tokens_per_request * self.safety_factor))

    @property
    def price_per_token(self) -> float:
        return self.price_rub_per_1m_tokens / 1_000_000


_INT_FIELDS = ("max_input_tokens", "max_inputs_per_request", "max_tokens_per_request", "dimensions")


def _model_from_mapping(name: str, raw: Any, where: str) -> ModelSpec:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: model {name!r} must be a mapping, got {type(raw).__name__}")
    expected = {f.name for f in dataclasses.fields(ModelSpec)} - {"name"}
    missing = sorted(expected - raw.keys())
    unknown = sorted(raw.keys() - expected)
    if missing or unknown:
        parts = [f"missing {missing}" if missing else "", f"unknown {unknown}" if unknown else ""]
        raise ConfigError(f"{where}: model {name!r}: " + "; ".join(p for p in parts if p))
    for field in _INT_FIELDS:
        value = raw[field]
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"{where}: model {name!r}: {field} must be a positive integer, got {value!r}")
    factor = raw["safety_factor"]
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise ConfigError(f"{where}: model {name!r}: safety_factor must be in (0, 1], got {factor!r}")
    price = raw["price_rub_per_1m_tokens"]
    if isinstance(price, bool) or not isinstance(price, (int, float)) or price < 0:
        raise ConfigError(f"{where}: model {name!r}: price_rub_per_1m_tokens must be >= 0, got {price!r}")
    if not isinstance(raw["supports_dimensions"], bool):
        raise ConfigError(f"{where}: model {name!r}: supports_dimensions must be true or false")
    if raw["tokenizer"] != "cl100k_base":
        raise ConfigError(f"{where}: model {name!r}: tokenizer {raw['tokenizer']!r} is not available "
                          "offline (only cl100k_base ships)")
    return ModelSpec(name=name, safety_factor=float(factor), price_rub_per_1m_tokens=float(price),
                     **{k: raw[k] for k in (*_INT_FIELDS, "tokenizer", "supports_dimensions")})


def parse_yaml_mapping(text: str, where: str, what: str = "a mapping") -> Mapping[str, Any]:
    """TEXT as a YAML mapping (empty text: {}); a ConfigError naming WHERE otherwise."""
    try:
        doc = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{where}: not valid YAML: {exc}") from None
    if not isinstance(doc, Mapping):
        raise ConfigError(f"{where}: expected {what}")
    return doc


def parse_models(text: str, where: str = "models.yaml") -> dict[str, ModelSpec]:
    doc = parse_yaml_mapping(text, where, "a top-level 'models' mapping")
    if not isinstance(doc.get("models"), Mapping) or not doc["models"]:
        raise ConfigError(f"{where}: expected a top-level 'models' mapping with at least one model")
    return {str(name): _model_from_mapping(str(name), raw, where) for name, raw in doc["models"].items()}


def load_models(path: str | None = None) -> dict[str, ModelSpec]:
    """Load the catalogue from PATH, or the configs/models.yaml shipped with the package."""
    if path is None:
        text = resources.files("configs").joinpath("models.yaml").read_text(encoding="utf-8")
        return parse_models(text, "configs/models.yaml")
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read model catalogue: {exc.strerror}") from None
    return parse_models(text, path)


def get_model(models: Mapping[str, ModelSpec], name: str) -> ModelSpec:
    try:
        return models[name]
    except KeyError:
        nearest = difflib.get_close_matches(name, models, n=1)
        hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
        raise ConfigError(f"unknown model {name!r}{hint}; known: {', '.join(sorted(models))}") from None

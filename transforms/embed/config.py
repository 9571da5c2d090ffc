"""What the Embed step is given, in the three things it is made of: the service (where, which
model, how hard to press it), the money (transforms/money/budget.Budget) and the output."""
from __future__ import annotations

import dataclasses
from typing import Any

import pyarrow as pa

from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import KeySource
from transforms.dedupe.known import KnownStores
from transforms.dedupe.store import StoreSpec
from transforms.money.budget import Budget


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    base_url: str
    account_segment: str
    key_source: KeySource
    model: str
    dimensions: int | None          # sent to the service only when set
    expected_dims: int
    retry: RetryPolicy
    pool_size: int
    encoding_format: str
    max_decoding: int
    max_in_flight: int              # the adaptive limit's ceiling (transforms/embed/ratelimit.py)
    initial_in_flight: int          # and where it starts
    admitted_after_s: float         # a request out this long without a 429 holds a place
    max_refused_s: float            # a request refused (429) is sent again for this long; a process
                                    # with no answer for this long stops sending
    requests_per_minute: int        # explicit quotas; 0: none
    tokens_per_minute: int

    def client(self, **overrides: Any) -> EmbeddingsClient:
        """A client of this process (the key is loaded here, on the worker, never pickled)."""
        kwargs = {"account_segment": self.account_segment, "retry": self.retry, "pool_size": self.pool_size,
                  "encoding_format": self.encoding_format, "max_decoding": self.max_decoding, **overrides}
        return EmbeddingsClient(self.base_url, self.key_source.load(), **kwargs)


@dataclasses.dataclass(frozen=True)
class OutputConfig:
    run_id: str
    output_dir: str | None          # DIR: the journal and the progress counts go there (None: neither)
    embeddings_schema: pa.Schema
    pending_schema: pa.Schema
    kept: tuple[pa.Field, ...]      # the input's kept columns, carried into every row
    progress_interval_s: float


@dataclasses.dataclass(frozen=True)
class EmbedConfig:
    service: ServiceConfig
    budget: Budget
    output: OutputConfig
    boundary_window: float          # re-splitting a text the service refused as too long
    known: KnownStores | None = None  # where pieces of a re-split text are looked up first
    store: StoreSpec | None = None    # where answers are kept and looked up (the library's; not with a DIR)
    claims: str | None = None         # the scope of the library's in-flight claims, sealed and settled by Embed

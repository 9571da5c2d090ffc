"""What the library's steps are given, from the same configs the CLI reads: configs/models.yaml
(the model's limits and price estimate) and configs/pipeline.yaml (client, splitting, packing,
in-flight limit, budget margins). Only where the key is comes from the caller: a KeySource
(an environment variable's name or a file's path), never the key itself. Built by the CLI's
own builder (pipeline/settings/steps.py)."""
from __future__ import annotations

import dataclasses

from pipeline.money import account as acct
from pipeline.settings import steps
from pipeline.settings.config import RunSettings
from service.catalog import ModelSpec, get_model
from service.client import check_base_url
from service.credentials import KeySource
from transforms import schemas
from transforms.dedupe.store import StoreSpec
from transforms.embed.config import EmbedConfig, OutputConfig, ServiceConfig
from transforms.money.budget import Budget
from transforms.read.split import SplitConfig


@dataclasses.dataclass(frozen=True)
class LibraryConfig:
    model: ModelSpec
    settings: RunSettings
    service: ServiceConfig

    @property
    def split(self) -> SplitConfig:
        return steps.split_config(self.settings, self.model)

    @property
    def margin(self) -> float:
        """Worst case per token over the catalogue price, until answers show the real price."""
        return self.settings.budget.price_margin / self.model.safety_factor

    def budget(self, max_spend_rub: float | None) -> Budget:
        """What may be spent: the account read now, in the driver (MissingApiKeyError names where
        to put the key), less the reserve, within MAX_SPEND_RUB."""
        with self.service.client(pool_size=1) as client:
            account = acct.read_account(client)
        b = self.settings.budget
        return Budget(account.balance, acct.spendable(account, b.reserve_rub, max_spend_rub), self.model.price_per_token,
                      self.margin, 1 / self.model.safety_factor, b.balance_poll_s)

    def embed_config(self, run_id: str, budget: Budget, store: StoreSpec, claims: str | None = None) -> EmbedConfig:
        """The Embed step's (or a Sender's) config for RUN_ID, its answers kept in STORE."""
        dims, s = self.service.expected_dims, self.settings
        meta = schemas.metadata(self.model.name, dims, run_id)
        output = OutputConfig(run_id, None, schemas.embeddings(dims, [], meta, s.output.chunk_text),
                              schemas.pending([], meta), (),
                              s.embed.progress_interval_s)
        return EmbedConfig(self.service, budget, output, s.split.boundary_window, store=store, claims=claims)


def resolve(model: str, base_url: str, keys: KeySource, dimensions: int | None = None,
            account_segment: str = "service", models_config: str | None = None,
            run_config: str | None = None) -> LibraryConfig:
    """The model and settings, checked in the driver (a ConfigError or ValueError names the problem)."""
    spec = get_model(steps.catalogue(models_config), model)
    check_base_url(base_url)
    settings = steps.run_settings(run_config)
    if dimensions is not None and not (spec.supports_dimensions and 1 <= dimensions <= spec.dimensions):
        raise ValueError(f"dimensions={dimensions} is not available for {spec.name}")
    return LibraryConfig(spec, settings, steps.service_config(settings, spec, base_url, account_segment, keys,
                                                              dimensions))

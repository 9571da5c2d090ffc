"""EmbedTexts: the CLI job's steps on a PCollection of dicts, for a user's own pipeline.

Read (the rows checked, split token-exact to the model's limit) -> Dedupe -> Pack -> Embed are
the job's transforms (transforms/read, transforms/dedupe, transforms/requests.py,
transforms/embed), with repeated ids rejected between Dedupe and Pack: the same
splitter, packer, request runner (bisection of 400s, re-split of over-length inputs, the
client's one retry loop), adaptive in-flight limit, budget guard and cost lineage. What the
job writes as Parquet comes out as dicts. Distinct texts are found by grouping on their digest
(the job's way on distributed runners), so each is paid once on any runner; the job's
streaming claims need its driver after the pipeline, which a library step does not have.

The driver reads the account once while the pipeline is built (the CLI does the same): no key
is an error then, before any bundle runs, and the budget guard starts from that balance.
"""
from __future__ import annotations

import datetime as dt
import secrets
from typing import NamedTuple

import apache_beam as beam
import pyarrow as pa

from embedpipe._config import read_budget, resolve
from service.credentials import ENV_VAR, KeySource
from transforms import schemas
from transforms.dedupe.known import KnownStores
from transforms.dedupe.transform import ITEMS, Dedupe
from transforms.embed.config import EmbedConfig, OutputConfig
from transforms.embed.transform import FAILED, PENDING, REQUESTS, EmbedRequests
from transforms.read.dicts import IDS, DropRepeatedIds, ReadRows
from transforms.read.transform import ENTRIES, REJECTED
from transforms.records import Rejected
from transforms.requests import pack


class EmbedResult(NamedTuple):
    """The PCollections EmbedTexts gives: every chunk of every input row is in exactly one of
    embeddings, failed, pending; requests holds one row per embeddings request (its cost)."""
    embeddings: beam.PCollection
    failed: beam.PCollection
    pending: beam.PCollection
    requests: beam.PCollection


def embedding_rows(table: pa.Table):
    """An embeddings table of the job -> one dict per row, `embedding` a float32 numpy array
    (a view into the table's vectors: no copy per row)."""
    column = table.column("embedding").combine_chunks()
    vectors = column.values.to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
    names = [n for n in table.schema.names if n != "embedding"]
    values = [table.column(n).to_pylist() for n in names]
    for i in range(table.num_rows):
        row = {n: v[i] for n, v in zip(names, values)}
        row["embedding"] = vectors[i]
        yield row


def failed_row(rejected: Rejected) -> dict:
    return rejected._asdict()


class EmbedTexts(beam.PTransform):
    """dicts with ID_FIELD and TEXT_FIELD -> EmbedResult (embeddings, failed, pending, requests).

    The key is read from the environment variable API_KEY_ENV or from API_KEY_FILE, in the
    driver (to read the balance) and again on each worker; it is never pickled. MAX_SPEND_RUB
    caps what this pipeline spends; the balance (and the key's budget) always do. Chunks the
    budget stops are `pending` with their text and reason. MODELS_CONFIG and RUN_CONFIG replace
    configs/models.yaml and configs/pipeline.yaml."""

    def __init__(self, model: str, base_url: str, *, api_key_env: str = ENV_VAR, api_key_file: str | None = None,
                 max_spend_rub: float | None = None, id_field: str = "id", text_field: str = "text",
                 dimensions: int | None = None, account_segment: str = "service",
                 models_config: str | None = None, run_config: str | None = None):
        super().__init__()
        if max_spend_rub is not None and not max_spend_rub >= 0:
            raise ValueError("max_spend_rub must be an amount >= 0")
        self._keys = KeySource(file=api_key_file, env_var=api_key_env)
        self._cfg = resolve(model, base_url, self._keys, dimensions=dimensions, account_segment=account_segment,
                            models_config=models_config, run_config=run_config)
        self._max_spend, self._fields = max_spend_rub, (id_field, text_field)

    def expand(self, rows):
        cfg, s = self._cfg, self._cfg.settings
        run_id = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-lib-" + secrets.token_hex(3)
        dims = cfg.service.expected_dims
        meta = schemas.metadata(cfg.model.name, dims, run_id)
        output = OutputConfig(run_id, None, schemas.embeddings(dims, [], meta), schemas.pending([], meta), (),
                              s.embed.progress_interval_s)
        embed = EmbedConfig(cfg.service, read_budget(cfg, self._max_spend), output, s.split.boundary_window)
        read = rows | "Read" >> ReadRows(*self._fields, cfg.split)
        dedupe = Dedupe(KnownStores(run_id, cfg.model.name, dims, (), ()), run_id, streaming=False)
        deduped = read[ENTRIES] | "Dedupe" >> dedupe
        kept = deduped[ITEMS] | "RepeatedIds" >> DropRepeatedIds(read[IDS])
        requests = pack(kept.items, dedupe, cfg.model, s.pack.fill_target, s.pack.max_open_requests)
        out = requests | "Embed" >> EmbedRequests(embed)
        failed = (read[REJECTED], kept[REJECTED], out[FAILED]) | "AllFailed" >> beam.Flatten()
        return EmbedResult(
            embeddings=out.embeddings | "EmbeddingRows" >> beam.FlatMap(embedding_rows),
            failed=failed | "FailedRows" >> beam.Map(failed_row),
            pending=out[PENDING] | "PendingRows" >> beam.FlatMap(lambda t: t.to_pylist()),
            requests=out[REQUESTS])

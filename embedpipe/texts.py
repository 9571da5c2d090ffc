"""EmbedTexts: the CLI job's embedding step on a PCollection of dicts, for a user's own pipeline.

ReadRows (the rows checked, split token-exact to the model's limit) -> EmbedChunks, the step
the CLI's graph runs between its Read and Write (transforms/requests.py): the same splitter,
packer, request runner (bisection of 400s, re-split of over-length inputs, the client's one
retry loop), adaptive in-flight limit, budget guard and cost lineage. What the job writes as
Parquet comes out as dicts. Texts stream: each worker process claims them as they come and
the store of paid texts (transforms/dedupe/inflight.py, store.py) remembers what was paid, so
the first request leaves as soon as one is full and nothing large crosses a stage boundary.

The driver reads the account once while the pipeline is built (the CLI does the same): no key
is an error then, before any bundle runs, and the budget guard starts from that balance.
"""
from __future__ import annotations

import datetime as dt
import secrets
from typing import Any, NamedTuple
from collections.abc import Sequence

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from embedpipe._config import resolve
from service.credentials import ENV_VAR, KeySource
from transforms.dedupe.inflight import StoreDedupe
from transforms.dedupe.store import spec
from transforms.embed.transform import FAILED, PENDING, REQUESTS
from transforms.read.dicts import ReadRows
from transforms.read.transform import ENTRIES, REJECTED
from transforms.records import Rejected, Row
from transforms.requests import EMBEDDINGS, EmbedChunks


class EmbedResult(NamedTuple):
    """The PCollections EmbedTexts gives: every chunk of every input row is in exactly one of
    embeddings, failed, pending; requests holds one row per embeddings request (its cost)."""
    embeddings: beam.PCollection
    failed: beam.PCollection
    pending: beam.PCollection
    requests: beam.PCollection


def embedding_rows(table: pa.Table):
    """An embeddings table of the job -> one dict (a Row: its coder sizes it without pickling)
    per row, `embedding` a float32 numpy array (a view into the table's vectors: no copy per row)."""
    column = table.column("embedding").combine_chunks()
    vectors = column.values.to_numpy(zero_copy_only=False).reshape(len(column), column.type.list_size)
    names = [n for n in table.schema.names if n != "embedding"] + ["embedding"]
    for fields in zip(*(table.column(n).to_pylist() for n in names[:-1]), vectors, strict=True):
        yield Row(zip(names, fields, strict=True))


def failed_row(rejected: Rejected) -> dict:
    return rejected._asdict()


class EmbedTexts(beam.PTransform):
    """dicts with ID_FIELD and TEXT_FIELD -> EmbedResult (embeddings, failed, pending, requests).

    The key is read from the environment variable API_KEY_ENV or from API_KEY_FILE, in the
    driver (to read the balance) and again on each worker; it is never pickled. MAX_SPEND_RUB
    caps what this pipeline spends; the balance (and the key's budget) always do. Chunks the
    budget stops are `pending` with their text and reason. STORE: where each answer is kept as
    soon as it is paid, on any Beam filesystem; a text it holds is taken from there at no cost.
    READ_STORES: other stores or CLI output DIRs, read only. MODELS_CONFIG and RUN_CONFIG
    replace configs/models.yaml and configs/pipeline.yaml (any Beam filesystem)."""

    def __init__(self, model: str, base_url: str, *, api_key_env: str = ENV_VAR, api_key_file: str | None = None,
                 max_spend_rub: float | None = None, id_field: str = "id", text_field: str = "text",
                 store: str | None = None, read_stores: Sequence[str] = (), dimensions: int | None = None,
                 account_segment: str = "service", models_config: str | None = None, run_config: str | None = None):
        super().__init__()
        if max_spend_rub is not None and not max_spend_rub >= 0:
            raise ValueError("max_spend_rub must be an amount >= 0")
        self._keys = KeySource(file=api_key_file, env_var=api_key_env)
        self._where: dict[str, Any] = {"model": model, "base_url": base_url, "dimensions": dimensions,
                       "account_segment": account_segment, "models_config": models_config, "run_config": run_config}
        self._max_spend, self._fields = max_spend_rub, (id_field, text_field)
        self._stores = (store, tuple(read_stores))

    def expand(self, rows):
        FileSystems.set_options(rows.pipeline.options)   # configs and the store as the workers reach them
        cfg = resolve(keys=self._keys, **self._where)
        s = cfg.settings
        store = spec(*self._stores, refresh_s=s.store.refresh_s)
        store = store if store.path else store._replace(spool=True)   # without one, this pipeline's own
        run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-lib-" + secrets.token_hex(3)
        embed = cfg.embed_config(run_id, cfg.budget(self._max_spend), store, claims=run_id)
        read = rows | "Read" >> ReadRows(*self._fields, cfg.split, run_id)
        dedupe = StoreDedupe(run_id, store, cfg.model.name, cfg.service.expected_dims)
        out = read[ENTRIES] | "EmbedChunks" >> EmbedChunks(dedupe, cfg.model, s.pack.fill_target,
                                                           s.pack.max_open_requests, embed)
        failed = (read[REJECTED], out[FAILED]) | "AllFailed" >> beam.Flatten()   # small records only
        return EmbedResult(
            embeddings=out[EMBEDDINGS] | "EmbeddingRows" >> beam.FlatMap(embedding_rows).with_output_types(Row),
            failed=failed | "FailedRows" >> beam.Map(failed_row),
            pending=out[PENDING] | "PendingRows" >> beam.FlatMap(lambda t: t.to_pylist()),
            requests=out[REQUESTS])

"""ServiceTextEmbeddings: an EmbeddingsManager for Beam's MLTransform (and ml.rag items) that
sends through the job's client and request runner (transforms/embed/send.py).

- batches by tokens: BatchElements weighs each element by its cl100k tokens, up to as many full
  requests as may be in flight; the job's Packer cuts a batch into requests within the model's
  caps, sent together under the job's adaptive in-flight limit (configs/pipeline.yaml, embed);
- a 400 is never retried: the runner bisects the request until the bad text stands alone and
  dead-letters it; the client's one retry loop handles 429s and 5xx, Retry-After included;
- each text's tokens and cost share come back with it (apportioned as the job does, so a
  request's shares sum to what the service billed); texts repeated within a batch are sent once;
- Beam counters in namespace `embedpipe`: tokens, cost_micro_rub, requests, retries, failed_texts;
- the key is read on the worker (load_model) from the environment or a file: the manager and
  its model handler hold only where it is, so MLTransform's artifacts never contain it.
"""
from __future__ import annotations

import concurrent.futures as cf
import functools
import hashlib
import secrets
from typing import Any, Sequence

from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.ml.transforms.base import EmbeddingsManager, EmbeddingTypeAdapter, _TextEmbeddingHandler

from embedpipe._config import resolve
from embedpipe.rag import Embedded, dict_adapter, element_texts, rag_adapter
from service.credentials import ENV_VAR, KeySource
from service.tokenizer import get_encoding
from transforms.embed.ratelimit import ConcurrencyLimiter
from transforms.embed.send import Breaker, RequestRunner
from transforms.money.apportion import apportion_micro, from_micro
from transforms.money.budget import BudgetGuard
from transforms.pack import Packer
from transforms.records import ChunkRef, TextItem

COUNTERS = ("tokens", "cost_micro_rub", "requests", "retries", "failed_texts")


def _element_tokens(columns: Sequence[str] | None, element: Any) -> int:
    return sum(len(t) for t in get_encoding().encode_ordinary_batch(element_texts(columns, element)))


class _Service:
    """The worker's side (built by load_model): a client with the key, the runner, the counters."""

    def __init__(self, where: dict):
        self.cfg = cfg = resolve(**where)
        self.client = cfg.service.client()
        guard = BudgetGuard(balance_before=None, spendable_rub=None, price_per_token_rub=cfg.model.price_per_token,
                            margin=cfg.margin)
        svc = cfg.service   # the job's adaptive in-flight limit, over the requests of a batch
        limiter = ConcurrencyLimiter(min(svc.initial_in_flight, svc.max_in_flight), maximum=svc.max_in_flight,
                                     admitted_after_s=svc.admitted_after_s)
        self.pool = cf.ThreadPoolExecutor(svc.max_in_flight, thread_name_prefix="embedpipe")
        self.runner = RequestRunner(self.client, model=cfg.model.name, dimensions=svc.dimensions,
                                    expected_dims=svc.expected_dims, guard=guard, breaker=Breaker(),
                                    run_id=f"mlt-{secrets.token_hex(6)}", resplit=lambda item: [item],
                                    concurrency=limiter, max_refused_s=svc.max_refused_s)
        self.m = {name: Metrics.counter("embedpipe", name) for name in COUNTERS}

    def embed(self, texts: Sequence[str]) -> list[Embedded]:
        model, results = self.cfg.model, [None] * len(texts)
        counts = [len(t) for t in get_encoding().encode_ordinary_batch(list(texts))]
        distinct: dict[str, tuple[str, int, list[int]]] = {}
        for i, (text, n) in enumerate(zip(texts, counts)):
            if not text.strip():
                results[i] = Embedded(None, 0, 0.0, None, "empty_text", "no text to embed (null, empty or not a str)")
            elif n > model.chunk_tokens:
                results[i] = Embedded(None, n, 0.0, None, "too_long",
                                      f"{n} tokens; {model.name} takes at most {model.chunk_tokens}: split it first")
            else:
                sha = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
                distinct.setdefault(sha, (text, n, []))[2].append(i)
        packer = Packer(model.max_inputs_per_request, model.request_tokens, self.cfg.settings.pack.fill_target)
        requests = []
        for sha, (text, n, rows) in distinct.items():
            refs = tuple(ChunkRef(str(i), 0, 1, 0, n, n, ()) for i in rows)
            requests += packer.add(TextItem(sha, text, n, refs), n)
        for outcome in self.pool.map(self.runner.run, requests + packer.flush()):
            self._deliver(outcome, results)
        self.m["failed_texts"].inc(sum(r.vector is None for r in results))
        return results

    def _deliver(self, outcome, results: list) -> None:
        for d in outcome.deliveries:
            for item, vector, share in zip(d.items, d.vectors, d.shares_micro):
                for ref, micro in zip(item.refs, apportion_micro(share, [1] * len(item.refs))):
                    results[int(ref.doc_id)] = Embedded(vector, item.n_tokens, from_micro(micro), d.request_id)
                self.m["tokens"].inc(item.n_tokens)
        for rejected in outcome.failed:
            results[int(rejected.doc_id)] = Embedded(None, 0, 0.0, None, rejected.reason, rejected.detail)
        for item, reason in outcome.pending:   # breaker or balance: nothing more is sent by this worker
            for ref in item.refs:
                results[int(ref.doc_id)] = Embedded(None, item.n_tokens, 0.0, None, reason, "not sent")
        self.m["requests"].inc(len(outcome.requests))
        self.m["retries"].inc(outcome.retries)
        self.m["cost_micro_rub"].inc(round(sum(r["cost_rub"] for r in outcome.requests) * 1e6))


class ServiceModelHandler(ModelHandler):
    """RunInference's handler: texts -> Embedded results. Holds only plain settings and where
    the key is (jsonpickled into MLTransform's artifacts as it is)."""

    def __init__(self, where: dict, columns: Sequence[str] | None, batch_tokens: int):
        super().__init__()
        self._where, self._columns = where, None if columns is None else list(columns)
        self._batch_tokens = batch_tokens

    def load_model(self) -> _Service:
        return _Service(self._where)

    def run_inference(self, batch: Sequence[str], model: _Service, inference_args=None) -> list[Embedded]:
        return model.embed(batch)

    def batch_elements_kwargs(self):
        # weights are tokens: a batch is as many full requests as may be in flight, cut by the
        # Packer within the model's caps and sent under the adaptive limit
        return {"min_batch_size": self._batch_tokens, "max_batch_size": self._batch_tokens,
                "element_size_fn": functools.partial(_element_tokens, self._columns)}

    def get_metrics_namespace(self) -> str:
        return "embedpipe"

    def __repr__(self) -> str:
        return f"ServiceTextEmbeddings({self._where['model']})"


class ServiceTextEmbeddings(EmbeddingsManager):
    """MLTransform provider. COLUMNS: the dict columns to embed (each replaced by its vector);
    without them, Beam ml.rag items (EmbeddableItem / Chunk) through `embedpipe.rag_adapter()`,
    or TYPE_ADAPTER's. The key: API_KEY_ENV or API_KEY_FILE, read where the texts are sent."""

    def __init__(self, columns: Sequence[str] | None = None, model: str | None = None,
                 base_url: str | None = None, *, api_key_env: str = ENV_VAR, api_key_file: str | None = None,
                 dimensions: int | None = None, account_segment: str = "service", models_config: str | None = None,
                 run_config: str | None = None, type_adapter: EmbeddingTypeAdapter | None = None, **kwargs):
        if not model or not base_url:
            raise TypeError("ServiceTextEmbeddings needs model= and base_url=")
        adapter = type_adapter or (dict_adapter(columns) if columns is not None else rag_adapter())
        super().__init__(type_adapter=adapter, **kwargs)
        self.columns = None if columns is None else list(columns)
        self.where = {"model": model, "base_url": base_url, "dimensions": dimensions,
                      "account_segment": account_segment, "models_config": models_config, "run_config": run_config}
        self.api_key_env, self.api_key_file = api_key_env, api_key_file
        resolve(keys=self._keys(), **self.where)   # a wrong model or URL fails here, in the driver

    def _keys(self) -> KeySource:
        return KeySource(file=self.api_key_file, env_var=self.api_key_env)

    def get_model_handler(self) -> ServiceModelHandler:
        cfg = resolve(keys=self._keys(), **self.where)
        return ServiceModelHandler({**self.where, "keys": self._keys()}, self.columns,
                                   cfg.model.request_tokens * cfg.service.max_in_flight)

    def get_ptransform_for_processing(self, **kwargs) -> RunInference:
        self._keys().load()   # no key: a clear error now, before any bundle runs (the value is not kept)
        return RunInference(model_handler=_TextEmbeddingHandler(self), inference_args=self.inference_args)

"""ServiceTextEmbeddings: an EmbeddingsManager for Beam's MLTransform (and ml.rag items) that
sends with the job's Sender (transforms/embed/sender.py): its budget guard, adaptive in-flight
limit, breaker and quota, and its request runner wired to the store of paid texts.

- the driver reads the account while the pipeline is built (embedpipe/_config.LibraryConfig, as
  EmbedTexts and the CLI do): each worker reserves a request's worst case before sending it,
  within max_spend_rub and the balance; a text the budget, the breaker or a timeout stops comes
  out without a vector, with its pending reason (transforms/pending.py), counted in `pending_texts`;
- each distinct text is paid once per worker process, whatever batch it comes in
  (embedpipe/paid.py): a text met before gets its vector at cost 0, one another batch is sending
  is waited for (and sent again by this batch if it got no vector there); with `store=`, across
  processes and pipelines too (transforms/dedupe/store.py, listed every store.refresh_s): a text
  the store holds is not sent, and each answer is put there as soon as it is paid (by the Sender);
- a text over the model's input limit is split token-exact, as the job splits (configs/
  pipeline.yaml, split), and gets the token-weighted mean of its pieces' vectors, re-normalised
  (what the CLI's --doc-vectors computes, transforms/write/docvectors.py);
- batches by tokens: as many full requests as may be in flight, cut by the job's Packer;
- Beam counters in namespace `embedpipe`: tokens, cost_micro_rub, requests, retries,
  failed_texts, pending_texts, reused_texts;
- the key is read in the driver (the account) and on the workers, never kept: MLTransform's
  artifacts hold the manager's settings only, and each pipeline that applies them reads the
  account again (ServiceEmbed.expand).
"""
from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import datetime as dt
import functools
import secrets
from typing import Any
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.ml.inference.base import ModelHandler, RunInference
from apache_beam.ml.transforms.base import EmbeddingsManager, EmbeddingTypeAdapter

from embedpipe._config import LibraryConfig, resolve
from embedpipe.paid import Answer, PaidTexts
from embedpipe.rag import Embedded, dict_adapter, element_texts, rag_adapter
from service.credentials import ENV_VAR, KeySource
from service.tokenizer import get_encoding
from transforms.dedupe import store as stores
from transforms.embed.config import EmbedConfig
from transforms.embed.send import Breaker, Outcome
from transforms.embed.sender import Sender
from transforms.money.apportion import apportion_micro, from_micro
from transforms.pack import Packer
from transforms.pending import REASONS, detail
from transforms.read.split import Chunk, Splitter
from transforms.records import ChunkRef, TextItem
from transforms.worker import runscoped
from transforms.write.docvectors import token_weighted_mean

COUNTERS = ("tokens", "cost_micro_rub", "requests", "retries", "failed_texts", "pending_texts", "reused_texts")
EMPTY = "no text to embed (null, empty or not a str)"
_Sent = tuple[Outcome, dict[str, Answer], dict[str, int]]   # a request's outcome, answers and shares


def _element_tokens(columns: Sequence[str] | None, element: Any) -> int:
    return sum(len(t) for t in get_encoding().encode_ordinary_batch(element_texts(columns, element)))


def _combined(parts: Sequence[Answer]) -> Answer:
    """One answer from its pieces' (or one piece's): the token-weighted mean of their vectors."""
    if len(parts) == 1:
        return parts[0]
    for index, p in enumerate(parts):
        if p.vector is None:
            return Answer(None, sum(p.n_tokens for p in parts), None, p.error,
                          f"piece {index + 1} of {len(parts)}: {p.detail}")
    request_ids = ",".join(dict.fromkeys(p.request_id for p in parts if p.request_id))
    return Answer(token_weighted_mean([p.n_tokens for p in parts], [p.vector for p in parts]),
                  sum(p.n_tokens for p in parts), request_ids or None)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What the workers are given (built in the driver; no key)."""
    cfg: LibraryConfig
    embed: EmbedConfig   # its store: where paid texts are kept (None: none)


class _Service:
    """The worker's side (RunInference's model): the job's Sender (client, shared guard,
    breaker and limiters, runner wired to the store) and this process's paid texts."""

    def __init__(self, job: _Job):
        self.cfg, self.run_id = job.cfg, job.embed.output.run_id
        self.sender = Sender(job.embed)
        self.store = self.sender.store
        self.paid = runscoped.shared(self.run_id, "paid", lambda: PaidTexts(job.cfg.service.expected_dims))
        # one vector per value: cut only where the model needs it, whatever split.chunk_tokens says
        self.splitter = Splitter(get_encoding(), dataclasses.replace(job.cfg.split,
                                                                     max_tokens=job.cfg.model.chunk_tokens))
        self.pool = cf.ThreadPoolExecutor(job.cfg.service.max_in_flight, thread_name_prefix="embedpipe")
        self.m = {name: Metrics.counter("embedpipe", name) for name in COUNTERS}

    def _held(self, chunks: dict) -> dict[str, Answer]:
        """What the store holds among CHUNKS (claimed by this batch): costs nothing, not sent."""
        found = self.store.lookup(list(chunks)) if self.store is not None and chunks else {}
        return {sha: Answer(f.vector, chunks[sha].n_tokens, f.request_id) for sha, f in found.items()}

    def embed(self, texts: Sequence[str]) -> list[Embedded]:
        """One result per text; its pieces (one, or several for a text over the limit) are sent
        unless this process holds their answers or another batch sends them with success."""
        pieces = self.splitter.split_many([("", t) for t in texts])   # a blank text: no piece
        wanted = {c.text_sha256: c for chunks in pieces for c in chunks}
        answers: dict[str, Answer] = {}
        shares: dict[str, int] = {}
        todo = list(wanted)
        while todo:   # again for the texts another batch was sending and got no vector for
            held, waiting, mine = self.paid.claim(todo)
            stored, sent, sent_shares = self._claimed({sha: wanted[sha] for sha in mine})
            waited = {sha: future.result() for sha, future in waiting.items()}
            answers.update(held | stored | sent | {sha: a for sha, a in waited.items() if a is not None})
            shares.update(sent_shares)
            todo = [sha for sha, a in waited.items() if a is None]
            self.m["reused_texts"].inc(len(held) + len(stored) + len(waiting) - len(todo))
        uses = collections.Counter(c.text_sha256 for chunks in pieces for c in chunks)
        costs = {sha: collections.deque(apportion_micro(shares.get(sha, 0), [1] * n)) for sha, n in uses.items()}
        results = []
        for text, chunks in zip(texts, pieces, strict=True):
            if not chunks:
                results.append(Embedded(None, 0, 0.0, None, "empty_text", EMPTY))
                continue
            a = _combined([answers[c.text_sha256] for c in chunks])
            cost = from_micro(sum(costs[c.text_sha256].popleft() for c in chunks))
            results.append(Embedded(a.vector, a.n_tokens, cost, a.request_id, a.error, a.detail,
                                    text if self.cfg.settings.output.chunk_text else None))
        self.m["failed_texts"].inc(sum(r.vector is None and r.error not in REASONS for r in results))
        self.m["pending_texts"].inc(sum(r.error in REASONS for r in results))
        return results

    def _claimed(self, chunks: dict[str, Chunk]) -> tuple[dict[str, Answer], dict[str, Answer], dict[str, int]]:
        """CHUNKS, claimed by this batch: (what the store held, what was sent, each sent text's
        share of its request's cost). Every claim is settled or released before this returns,
        whatever raised: a text in a request still on the wire stays claimed until that request
        ends, so a batch waiting for it takes its answer and never pays for it again."""
        futures: list[cf.Future[_Sent]] = []
        unsent = set(chunks)
        try:
            stored = self._held(chunks)
            for sha, answer in stored.items():
                self.paid.settle(sha, answer)
                unsent.discard(sha)
            for request in self._requests([chunks[sha] for sha in chunks if sha not in stored]):
                futures.append(self.pool.submit(self._send, request))
                unsent.difference_update(item.text_sha256 for item in request)
        finally:
            for sha in unsent:   # never left: no request will settle them
                self.paid.release(sha)
            cf.wait(futures)     # each request settles its own texts when it ends
        sent: dict[str, Answer] = {}
        shares: dict[str, int] = {}
        for future in futures:   # the first failure is raised once every request has ended
            outcome, got, got_shares = future.result()
            self._count(outcome)
            sent.update(got)
            shares.update(got_shares)
        return stored, sent, shares

    def _requests(self, chunks: Sequence[Chunk]) -> list[list[TextItem]]:
        """CHUNKS packed into requests within the model's caps, sent together under the job's
        adaptive limit."""
        self.sender.shared.guard.poll()   # balance, key budget: now and then, within their rate limit
        model, s = self.cfg.model, self.cfg.settings
        packer = Packer(model.max_inputs_per_request, model.request_tokens, s.pack.fill_target)
        requests: list[list[TextItem]] = []
        for c in chunks:
            ref = ChunkRef(c.text_sha256, 0, 1, 0, c.n_tokens, c.n_tokens, ())
            requests += packer.add(TextItem(c.text_sha256, c.text, c.n_tokens, (ref,)), c.n_tokens)
        return requests + packer.flush()

    def _send(self, request: Sequence[TextItem]) -> _Sent:
        """One request, on a thread of the pool: each of its texts settled with its answer as
        soon as it ends, or released if it raised (a batch waiting for one then sends it)."""
        settled: set[str] = set()
        try:
            outcome = self.sender.run(request)
            got, shares = _answers(outcome, self.sender.shared.breaker)
            for item in request:
                self.paid.settle(item.text_sha256, got[item.text_sha256])
                settled.add(item.text_sha256)
            return outcome, got, shares
        finally:
            for item in request:
                if item.text_sha256 not in settled:
                    self.paid.release(item.text_sha256)

    def _count(self, outcome: Outcome) -> None:
        """OUTCOME in the Beam counters (on the bundle's thread: Beam counts only there)."""
        self.m["tokens"].inc(sum(item.n_tokens for d in outcome.deliveries for item in d.items))
        self.m["requests"].inc(len(outcome.requests))
        self.m["retries"].inc(outcome.retries)
        self.m["cost_micro_rub"].inc(round(sum(r["cost_rub"] for r in outcome.requests) * 1e6))


def _answers(outcome: Outcome, breaker: Breaker) -> tuple[dict[str, Answer], dict[str, int]]:
    """The answer to each text of one request (its vector, the mean of its pieces' when the
    service found it too long and the runner split it, or why it has none) and its share of
    the cost."""
    parts: dict[str, list[Answer]] = collections.defaultdict(list)
    shares: dict[str, int] = {}
    errors: dict[str, tuple[str, str | None]] = {}
    for d in outcome.deliveries:
        for item, vector, share in zip(d.items, d.vectors, d.shares_micro, strict=True):
            sha = item.refs[0].doc_id
            parts[sha].append(Answer(vector, item.n_tokens, d.request_id))
            shares[sha] = shares.get(sha, 0) + share
    for rejected in outcome.failed:
        if rejected.doc_id is not None:   # the text's digest: each item's only ref (see _requests)
            errors[rejected.doc_id] = (rejected.reason, rejected.detail)
    for item, reason in outcome.pending:   # the budget, a 402, the breaker, a timeout: not embedded
        errors[item.refs[0].doc_id] = (reason, detail(reason, breaker.message if reason == breaker.reason else None))
    got = {sha: Answer(None, 0, None, *errors[sha]) for sha in errors}
    got.update((sha, _combined(p)) for sha, p in parts.items() if sha not in errors)
    return got, shares


class ServiceModelHandler(ModelHandler):
    """RunInference's handler: elements -> the same elements with their vectors, through the
    manager's type adapter. Holds the driver's settings and budget, never the key."""

    def __init__(self, job: _Job, adapter: EmbeddingTypeAdapter, columns: Sequence[str] | None):
        super().__init__()
        self._job, self._adapter = job, adapter
        self._columns = None if columns is None else list(columns)

    def load_model(self) -> _Service:
        return _Service(self._job)

    def run_inference(self, batch: Sequence[Any], model: _Service, inference_args=None) -> list[Any]:
        return self._adapter.output_fn(batch, model.embed(self._adapter.input_fn(batch)))

    def batch_elements_kwargs(self):
        # weights are tokens: a batch is as many full requests as may be in flight, cut by the
        # Packer within the model's caps and sent under the adaptive limit
        cfg = self._job.cfg
        size = cfg.model.request_tokens * cfg.service.max_in_flight
        return {"min_batch_size": size, "max_batch_size": size,
                "element_size_fn": functools.partial(_element_tokens, self._columns)}

    def get_metrics_namespace(self) -> str:
        return "embedpipe"

    def __repr__(self) -> str:
        return f"ServiceTextEmbeddings({self._job.cfg.model.name})"


class ServiceEmbed(beam.PTransform):
    """What MLTransform applies (and saves into its artifacts: the manager, no budget, no key):
    reads the account when applied, then RunInference with a ServiceModelHandler."""

    def __init__(self, manager: ServiceTextEmbeddings, exception_handling: dict | None = None):
        super().__init__()
        self._manager, self._exception_handling = manager, exception_handling

    def with_exception_handling(self, **kwargs) -> ServiceEmbed:
        """As RunInference's: MLTransform's with_exception_handling() calls it."""
        return ServiceEmbed(self._manager, kwargs)

    def annotations(self):
        return {**super().annotations(), "model_handler": f"ServiceTextEmbeddings({self._manager.where['model']})"}

    def expand(self, pcoll):
        FileSystems.set_options(pcoll.pipeline.options)   # configs and the store as the workers reach them
        m = self._manager
        inference = RunInference(ServiceModelHandler(m.job(), m.type_adapter, m.columns),
                                 inference_args=m.inference_args)
        if self._exception_handling is not None:
            inference = inference.with_exception_handling(**self._exception_handling)
        return pcoll | "RunInference" >> inference


class ServiceTextEmbeddings(EmbeddingsManager):
    """MLTransform provider. COLUMNS: the dict columns to embed (each replaced by its vector);
    without them, Beam ml.rag items (EmbeddableItem / Chunk) through `embedpipe.rag_adapter()`,
    or TYPE_ADAPTER's. The key: API_KEY_ENV or API_KEY_FILE, read where the texts are sent.
    MAX_SPEND_RUB caps what each pipeline that applies it spends; the balance always does.
    STORE: where paid texts are kept (any Beam filesystem); READ_STORES: more stores or CLI
    output DIRs, whose texts are taken and never written."""

    def __init__(self, columns: Sequence[str] | None = None, model: str | None = None,
                 base_url: str | None = None, *, api_key_env: str = ENV_VAR, api_key_file: str | None = None,
                 max_spend_rub: float | None = None, store: str | None = None, read_stores: Sequence[str] = (),
                 dimensions: int | None = None, account_segment: str = "service", models_config: str | None = None,
                 run_config: str | None = None, type_adapter: EmbeddingTypeAdapter | None = None, **kwargs):
        if not model or not base_url:
            raise TypeError("ServiceTextEmbeddings needs model= and base_url=")
        if max_spend_rub is not None and not max_spend_rub >= 0:
            raise ValueError("max_spend_rub must be an amount >= 0")
        adapter = type_adapter or (dict_adapter(columns) if columns is not None else rag_adapter())
        super().__init__(type_adapter=adapter, **kwargs)
        self.columns = None if columns is None else list(columns)
        self.where: dict[str, Any] = {"model": model, "base_url": base_url, "dimensions": dimensions,
                      "account_segment": account_segment, "models_config": models_config, "run_config": run_config}
        self.api_key_env, self.api_key_file = api_key_env, api_key_file
        self.max_spend_rub = max_spend_rub
        self.store, self.read_stores = store, tuple(read_stores)

    def _config(self) -> LibraryConfig:
        return resolve(keys=KeySource(file=self.api_key_file, env_var=self.api_key_env), **self.where)

    def job(self) -> _Job:
        """What the workers of one pipeline get: the settings, the store (a CLI output DIR as
        store=: a StoreError) and the budget read from the account now (no key: a
        MissingApiKeyError naming where to put it, before any bundle runs)."""
        cfg = self._config()
        store = stores.spec(self.store, self.read_stores, refresh_s=cfg.settings.store.refresh_s)
        run_id = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-mlt-" + secrets.token_hex(3)
        return _Job(cfg, cfg.embed_config(run_id, cfg.budget(self.max_spend_rub), store))

    def get_model_handler(self) -> ServiceModelHandler:
        return ServiceModelHandler(self.job(), self.type_adapter, self.columns)

    def get_ptransform_for_processing(self, **kwargs) -> ServiceEmbed:
        return ServiceEmbed(self)

"""EmbedTexts's fused stage (ReadRows -> Claim -> Pack -> Embed) driven as Beam's SDK harness
drives it, so that a bundle can fail and be retried in the same process (the FnApiRunner
never retries one): DoFns copied as the runner deserializes them, set up once, each bundle's
elements pushed through and finish_bundle called in order, upstream first. A bundle that
raises is torn down (the harness discards its processor) and its outputs are dropped; the
instances of a bundle that succeeded serve the next one."""
from __future__ import annotations

import collections
import datetime as dt
import hashlib
import secrets

import apache_beam as beam
from apache_beam.internal import pickler
from apache_beam.utils.windowed_value import WindowedValue

from embedpipe._config import resolve
from service.credentials import KeySource
from transforms.dedupe.inflight import _ClaimOrStored
from transforms.dedupe.store import spec
from transforms.embed.transform import FAILED, PENDING, REQUESTS, _EmbedDoFn
from transforms.pack import _PackDoFn
from transforms.read.dicts import _ReadRows
from transforms.read.transform import REJECTED

MODEL = "text-embedding-3-small"


def library_fns(base_url: str, store: str | None, *, run_config: str | None = None,
                models_config: str | None = None, max_inputs: int | None = None, budget=None,
                run_id: str | None = None) -> tuple[list[beam.DoFn], object]:
    """The DoFns EmbedTexts(MODEL, BASE_URL, store=STORE) runs in its fused stage, ReadRows
    reading one row at a time (so that each row reaches the claims at once), and the budget
    (read from the account unless BUDGET is given)."""
    cfg = resolve(MODEL, base_url, KeySource(), models_config=models_config, run_config=run_config)
    s = cfg.settings
    where = spec(store, refresh_s=s.store.refresh_s)
    where = where if where.path else where._replace(spool=True)
    run_id = run_id or dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-lib-" + secrets.token_hex(3)
    budget = budget if budget is not None else cfg.budget(None)
    embed = cfg.embed_config(run_id, budget, where, claims=run_id)
    return [_ReadRows("id", "text", cfg.split, run_id, 1),
            _ClaimOrStored(run_id, where, MODEL, cfg.service.expected_dims),
            _PackDoFn(max_inputs or cfg.model.max_inputs_per_request, cfg.model.request_tokens, s.pack.fill_target,
                      s.pack.max_open_requests),
            _EmbedDoFn(embed)], budget


class Processor:
    """One bundle processor of the stage (its own copies of the DoFns, set up)."""

    def __init__(self, fns: list[beam.DoFn]):
        self.fns = [pickler.loads(pickler.dumps(fn)) for fn in fns]
        for fn in self.fns:
            fn.setup()
        self.broken = False

    def bundle(self) -> Bundle:
        assert not self.broken, "the harness never reuses a processor whose bundle failed"
        return Bundle(self)

    def teardown(self) -> None:
        for fn in self.fns:
            fn.teardown()


class Bundle:
    """One attempt: push(rows) any number of times, then finish() (the outputs) or fail()."""

    def __init__(self, processor: Processor):
        self._processor, self._fns = processor, processor.fns
        self.out: dict[str, list] = collections.defaultdict(list)
        for fn in self._fns:
            fn.start_bundle()

    def push(self, rows) -> None:
        for row in rows:
            self._route(0, self._fns[0].process(row))

    def finish(self) -> dict[str, list]:
        for i, fn in enumerate(self._fns):
            self._route(i, fn.finish_bundle())
        return self.out

    def fail(self) -> None:
        """The bundle raised: Beam discards its processor and tears its DoFns down."""
        self._processor.broken = True
        self._processor.teardown()

    def _route(self, i: int, outputs) -> None:
        for out in outputs or ():
            tag, value = (out.tag, out.value) if isinstance(out, beam.pvalue.TaggedOutput) else (None, out)
            if isinstance(value, WindowedValue):
                value = value.value
            if tag is not None:
                self.out[{REJECTED: FAILED}.get(tag, tag)].append(value)
            elif i + 1 < len(self._fns):
                self._route(i + 1, self._fns[i + 1].process(value))
            else:
                self.out["embeddings"].append(value)


def rows_of(out: dict[str, list]) -> dict[str, list]:
    """Each kind's rows as (doc_id, chunk_index[, reason]) tuples."""
    embedded = [(r["doc_id"], r["chunk_index"]) for t in out["embeddings"] for r in t.to_pylist()]
    failed = [(r.doc_id, r.chunk_index, r.reason) for r in out[FAILED]]
    pending = [(r["doc_id"], r["chunk_index"], r["reason"]) for t in out[PENDING] for r in t.to_pylist()]
    return {"embeddings": embedded, "failed": failed, "pending": pending, "requests": list(out[REQUESTS])}


def text_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def paid_texts(sandbox) -> collections.Counter:
    """How many times the sandbox billed each text (by its sha256)."""
    return collections.Counter(sha for c in sandbox.ledger() for sha in c["input_sha256"])

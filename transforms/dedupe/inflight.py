"""Distinct texts for a step with no driver after it (the library's): each worker process claims
texts as they stream and the store of paid texts (transforms/dedupe/store.py) remembers what
was paid, so nothing is held or grouped and every row ends inside the pipeline.

A row's text is, in this process:
- claimed in its bundle and not yet sent: the row joins the claim (the request carries it,
  sharing the cost). Claims are a bundle's (the item carries its bundle's number to the seal),
  and a bundle that fails drops its claims when Beam tears its instance down, before the runner
  retries it: the retry claims its rows anew, rows that join during the retry included;
- in a request in flight: the row waits until that request is settled, however long it takes
  (retries, timeouts, bisection, waits for the budget or a place): a bound it could outlive
  would send the text again while the first request may still be billed. The Embed step seals
  a request right before it submits it and settles it when it ends, or at once if it never
  left (transforms/embed/transform.py), so no settle is ever missed;
- held by the store (paid by this process, another, or an earlier run): the row takes the
  vector from there, at no cost, with the request that paid for it (stored_outcome);
- else the row claims it. Only a vector is shared: a text whose request ended without one
  (failed, pending, cut in pieces) or whose bundle failed is released, and whoever meets it
  next claims it again (a 400 is not billed, the budget decides again, pieces come from the store).
So a text may be paid once by each bundle that holds it claimed at the same moment, and by
each process that meets it before another's answer is in its index (store.refresh_s).
ServiceTextEmbeddings keeps the same rule with embedpipe/paid.PaidTexts: it claims a whole
batch at once and keeps the vectors themselves (MLTransform without a store has no other place).
"""
from __future__ import annotations

import collections
import itertools
import threading
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from transforms.dedupe.store import PaidStore, StoreSpec
from transforms.pending import Pending
from transforms.records import ChunkRef, Request, StoredItem, TextItem
from transforms.worker import coders, runscoped  # noqa: F401  (coders: the coder of Request, pa.Table)
from transforms.worker.keyindex import key16

FIRST, JOINED, STORED_ALREADY = "first", "joined", "stored"
_BUNDLES = itertools.count(1)     # bundle numbers of this process (0: a text no bundle claimed)


class InFlightClaims:
    """The texts one process has claimed and not yet seen answered (pure logic, thread-safe)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._open: dict[bytes, dict[int, list[ChunkRef]]] = {}   # claimed, not sent: rows per bundle
        self._sent: collections.Counter = collections.Counter()    # in requests in flight

    @classmethod
    def for_run(cls, scope: str) -> InFlightClaims:
        return runscoped.shared(scope, "inflight", cls)

    @staticmethod
    def bundle() -> int:
        """A new bundle's number (Claim's start_bundle)."""
        return next(_BUNDLES)

    def add(self, sha: str, ref: ChunkRef, bundle: int, stored) -> str:
        """FIRST: REF claims the text for BUNDLE (the caller sends it, its item's `claim` BUNDLE);
        JOINED: REF goes with its bundle's claim not yet sent; STORED_ALREADY: STORED(key16) says
        the store holds it (looked at once no request of it is in flight)."""
        key = key16(sha)
        with self._cond:
            self._cond.wait_for(lambda: key not in self._sent)
            claims = self._open.get(key)
            if claims is not None and (rows := claims.get(bundle)) is not None:
                rows.append(ref)
                return JOINED
            if stored(key):
                return STORED_ALREADY
            self._open.setdefault(key, {})[bundle] = [ref]
            return FIRST

    def seal(self, request: Request) -> tuple[Request, list[bytes]]:
        """REQUEST leaves: each text it claimed carries every row of its claim; later rows wait
        for the answer. Returns the request and what is now in flight, for settle()."""
        items, sent = [], []
        with self._cond:
            for item in request:
                key = key16(item.text_sha256)
                claims = self._open.get(key)
                rows = claims.pop(item.claim, None) if claims is not None else None
                if rows is None:   # no claim of its bundle open (not the library's item): as it is
                    items.append(item)
                    continue
                if not claims:
                    del self._open[key]
                self._sent[key] += 1
                sent.append(key)
                items.append(item._replace(refs=tuple(sorted(rows))))
        return Request(items), sent

    def settle(self, sent: list[bytes]) -> None:
        """What seal() put in flight is over (its answers in the store, or not): waiting rows go on."""
        with self._cond:
            for key in sent:
                self._sent[key] -= 1
                if not self._sent[key]:
                    del self._sent[key]
            self._cond.notify_all()

    def release(self, bundle: int) -> None:
        """BUNDLE failed: its claims not sent go (their rows go with the bundle; its retry claims
        them again). A bundle that succeeded has none left: each went with its request."""
        with self._cond:
            for key in [k for k, claims in self._open.items() if bundle in claims]:
                del self._open[key][bundle]
                if not self._open[key]:
                    del self._open[key]


class _ClaimOrStored(beam.DoFn):
    def __init__(self, scope: str, store: StoreSpec, model: str, dims: int):
        self._scope, self._where = scope, (store, model, dims)
        self._distinct = Metrics.counter("embedpipe", "distinct_chunks")
        self._deduplicated = Metrics.counter("embedpipe", "chunks_deduplicated")
        self._reused = Metrics.counter("embedpipe", "chunks_reused")

    def setup(self):
        self._claims = InFlightClaims.for_run(self._scope)
        self._store = PaidStore.shared(*self._where, self._scope)

    def start_bundle(self):
        self._bundle = self._claims.bundle()

    def process(self, entry):
        sha, (text, n_tokens, ref) = entry
        kind = self._claims.add(sha, ref, self._bundle, self._store.holds_key)
        if kind == FIRST:
            self._distinct.inc()
            yield TextItem(sha, text, n_tokens, (ref,), self._bundle)
        elif kind == STORED_ALREADY:
            self._reused.inc()
            yield StoredItem(sha, text, n_tokens, (ref,))
        else:
            self._deduplicated.inc()

    def teardown(self):
        """Beam tears down a failed bundle's instances before the runner retries it."""
        if getattr(self, "_bundle", None):
            self._claims.release(self._bundle)


class StoreDedupe(beam.PTransform):
    """Dedupe for a step with no driver after it: (text_sha256, (text, n_tokens, ChunkRef)) ->
    `items`: a TextItem per text this process claims and a StoredItem per row whose text the
    store holds; Pack batches the latter apart and Embed takes their vectors from the store
    (stored_tables). No seal step: Embed seals each request as it submits it (EmbedConfig.claims,
    SCOPE), in the same fused stage as the claims."""

    def __init__(self, scope: str, store: StoreSpec, model: str, dims: int):
        super().__init__()
        self._fn = _ClaimOrStored(scope, store, model, dims)

    def expand(self, entries):
        return {"items": entries | "Claim" >> beam.ParDo(self._fn)}


def stored_outcome(store: PaidStore, batch: Sequence[StoredItem]) -> tuple[list[TextItem], np.ndarray, list,
                                                                           list[tuple[TextItem, Pending]]]:
    """(items found, their vectors, the requests that paid for them, items the store lost since
    it said it held them: pending)."""
    found = store.lookup([i.text_sha256 for i in batch])
    hits = [TextItem(*i) for i in batch if i.text_sha256 in found]
    vectors = np.stack([found[i.text_sha256].vector for i in hits]) if hits else np.empty((0, store.dims), "<f4")
    lost = [(TextItem(*i), Pending.STORE_CHANGED) for i in batch if i.text_sha256 not in found]
    return hits, vectors, [found[i.text_sha256].request_id for i in hits], lost

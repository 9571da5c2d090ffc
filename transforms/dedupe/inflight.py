"""Distinct texts for a step with no driver after it (the library's): each worker process claims
texts as they stream and the store of paid texts (transforms/dedupe/store.py) remembers what
was paid, so nothing is held or grouped and every row ends inside the pipeline.

A row's text is, in this process:
- claimed in its bundle and not yet sent: the row joins the claim (the request carries it,
  sharing the cost); claims are a bundle's, so a bundle the runner retries starts clean;
- in a request in flight: the row waits for the answer (at most one request's latency; rare:
  a claim stays open while its request fills, and that is when most repeats come);
- held by the store (paid by this process, another, or an earlier run): the row takes the
  vector from there, at no cost, with the request that paid for it (stored_outcome);
- else the row claims it. A text whose request ended without a vector (failed, pending, cut
  in pieces) is released: its next row claims it again, and the request runner decides again
  (a 400 is not billed, the budget still refuses, pieces come from the store).
Claims live only while a text is unsent or in flight; what was paid is the store's (~50 bytes
a text in each process's index). So a text may be paid once by each bundle that holds it
claimed at the same moment, and by each process that meets it before another's answer is in
its index (configs/pipeline.yaml store.refresh_s).
"""
from __future__ import annotations

import collections
import threading
from collections.abc import Iterable, Sequence

import apache_beam as beam
import numpy as np
from apache_beam.metrics import Metrics

from transforms.dedupe.store import PaidStore, StoreSpec
from transforms.pending import STORE_CHANGED   # the store lost a text between its lookup and its read
from transforms.records import ChunkRef, Request, StoredItem, TextItem
from transforms.worker import coders, runscoped  # noqa: F401  (coders: the coder of Request, pa.Table)
from transforms.worker.keyindex import key16

FIRST, JOINED, STORED_ALREADY = "first", "joined", "stored"
class InFlightClaims:
    """The texts one process has claimed and not yet seen answered (pure logic, thread-safe).
    An open claim is its bundle's (BUNDLE: a token of the claiming DoFn's bundle): a bundle
    that fails takes its claims' rows with it, and the runner's retry claims them again."""

    def __init__(self, max_wait_s: float):
        """MAX_WAIT_S: how long a row waits at most for its text's answer in flight, the longest a
        request can take (transforms/embed/config.py `ServiceConfig.longest_request_s`): a row
        that stopped waiting earlier would send its text again while the first may be billed."""
        self._cond = threading.Condition()
        self._open: dict[bytes, dict[object, list[ChunkRef]]] = {}   # claimed, not sent: rows per bundle
        self._sent: collections.Counter = collections.Counter()      # in requests in flight
        self._max_wait_s = max_wait_s

    @classmethod
    def for_run(cls, scope: str, max_wait_s: float) -> InFlightClaims:
        return runscoped.shared(scope, "inflight", lambda: cls(max_wait_s))

    def add(self, sha: str, ref: ChunkRef, bundle: object, stored) -> str:
        """FIRST: REF claims the text (the caller sends it); JOINED: REF goes with its bundle's
        claim not yet sent; STORED_ALREADY: STORED(key16) says the store holds it (after waiting
        for an answer in flight, at most max_wait_s: then the row claims it again)."""
        key = key16(sha)
        with self._cond:
            if key in self._sent:
                self._cond.wait_for(lambda: key not in self._sent, timeout=self._max_wait_s)
            claims = self._open.get(key)
            if claims is not None and (rows := claims.get(bundle)) is not None:
                rows.append(ref)
                return JOINED
            if stored(key):
                return STORED_ALREADY
            self._open.setdefault(key, {})[bundle] = [ref]
            return FIRST

    def seal(self, item: TextItem) -> TextItem:
        """ITEM's request leaves: it carries every row of the claim its first row made; rows
        that come later wait for the answer."""
        key = key16(item.text_sha256)
        with self._cond:
            claims = self._open.get(key, {})
            bundle = next((b for b, rows in claims.items() if rows[0] == item.refs[0]), None)
            if bundle is None:
                return item
            rows = claims.pop(bundle)
            if not claims:
                del self._open[key]
            self._sent[key] += 1
        return item._replace(refs=tuple(sorted(rows)))

    def settle(self, items: Iterable[TextItem]) -> None:
        """ITEMS' request ended (its answers in the store, or not): their waiting rows go on."""
        with self._cond:
            for item in items:
                key = key16(item.text_sha256)
                if self._sent[key] > 0:
                    self._sent[key] -= 1
                    if not self._sent[key]:
                        del self._sent[key]
            self._cond.notify_all()


class _ClaimOrStored(beam.DoFn):
    def __init__(self, scope: str, store: StoreSpec, model: str, dims: int, max_wait_s: float):
        self._scope, self._where, self._max_wait_s = scope, (store, model, dims), max_wait_s
        self._distinct = Metrics.counter("embedpipe", "distinct_chunks")
        self._deduplicated = Metrics.counter("embedpipe", "chunks_deduplicated")
        self._reused = Metrics.counter("embedpipe", "chunks_reused")

    def setup(self):
        self._claims = InFlightClaims.for_run(self._scope, self._max_wait_s)
        self._store = PaidStore.shared(*self._where, self._scope)

    def start_bundle(self):
        self._bundle = object()

    def process(self, entry):
        sha, (text, n_tokens, ref) = entry
        kind = self._claims.add(sha, ref, self._bundle, self._store.holds_key)
        if kind == FIRST:
            self._distinct.inc()
            yield TextItem(sha, text, n_tokens, (ref,))
        elif kind == STORED_ALREADY:
            self._reused.inc()
            yield StoredItem(sha, text, n_tokens, (ref,))
        else:
            self._deduplicated.inc()


class StoreDedupe(beam.PTransform):
    """Dedupe for a step with no driver after it: (text_sha256, (text, n_tokens, ChunkRef)) ->
    `items`: a TextItem per text this process claims (its rows completed by seal()) and a
    StoredItem per row whose text the store holds; Pack batches the latter apart and Embed
    takes their vectors from the store (stored_tables)."""

    def __init__(self, scope: str, store: StoreSpec, model: str, dims: int, max_wait_s: float):
        super().__init__()
        self._scope, self._max_wait_s = scope, max_wait_s
        self._fn = _ClaimOrStored(scope, store, model, dims, max_wait_s)

    def expand(self, entries):
        return {"items": entries | "Claim" >> beam.ParDo(self._fn)}

    def seal(self) -> beam.PTransform:
        return SealInFlight(self._scope, self._max_wait_s)


class SealInFlight(beam.PTransform):
    """Packed requests -> the same, each text with every row that claimed it before it left."""

    def __init__(self, scope: str, max_wait_s: float):
        super().__init__()
        self._scope, self._max_wait_s = scope, max_wait_s

    def expand(self, requests):
        scope, max_wait_s = self._scope, self._max_wait_s

        def seal(request: Request) -> Request:
            claims = InFlightClaims.for_run(scope, max_wait_s)
            return Request(claims.seal(item) for item in request)

        return requests | "Seal" >> beam.Map(seal).with_output_types(Request)


def stored_outcome(store: PaidStore, batch: Sequence[StoredItem]) -> tuple[list[TextItem], np.ndarray, list, list]:
    """(items found, their vectors, the requests that paid for them, items the store lost since
    it said it held them: pending)."""
    found = store.lookup([i.text_sha256 for i in batch])
    hits = [TextItem(*i) for i in batch if i.text_sha256 in found]
    vectors = np.stack([found[i.text_sha256].vector for i in hits]) if hits else np.empty((0, store.dims), "<f4")
    lost = [(TextItem(*i), STORE_CHANGED) for i in batch if i.text_sha256 not in found]
    return hits, vectors, [found[i.text_sha256].request_id for i in hits], lost

"""Pack: distinct texts -> requests within the model's input and token caps, >= fill_target full
whenever enough texts wait in the bundle (Beam's BatchElements counts elements and cannot
weigh them by tokens).

Packer (pure logic) is a streaming first-fit over a bounded set of open requests. Guarantees
(tests/unit/test_pack.py): no request is empty or over either cap (an item alone over
max_tokens travels alone: the service's answer decides, and an over-length 400 is re-split
by the caller); every item comes out exactly once; at most max_open_bins + 1 requests are
held. Fill: a request closed by add() is fill_target full by tokens, or full by inputs, or
was the fullest of the open set when the set overflowed, which only happens when the
arriving item fits none of them, so it holds more than max_tokens - (that item's tokens).
Hence with items of at most (1 - fill_target) * max_tokens every request but the ones
flush() returns is fill_target full. flush() packs what is left again, largest first, so no
two flushed requests could have been one.
"""
from __future__ import annotations

from typing import Any

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from transforms.records import Request, StoredItem
from transforms.worker import coders  # noqa: F401  (registers the coder of Request)


STORED_PER_BATCH = 1000   # rows read from the store per table (one file's row group is read once a batch)


class _Bin:
    __slots__ = ("items", "sizes", "tokens")

    def __init__(self):
        self.items: list[Any] = []
        self.sizes: list[int] = []
        self.tokens = 0

    def put(self, item: Any, n_tokens: int) -> None:
        self.items.append(item)
        self.sizes.append(n_tokens)
        self.tokens += n_tokens


class Packer:
    """max_inputs, max_tokens: the request caps (ModelSpec.max_inputs_per_request,
    request_tokens). fill_target: close a request once this fraction of max_tokens is used.
    max_open_bins: requests being filled at once (memory, and how long an item may wait)."""

    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float = 0.99,
                 max_open_bins: int = 16):
        if max_inputs < 1 or max_tokens < 1 or max_open_bins < 1:
            raise ValueError("max_inputs, max_tokens and max_open_bins must be >= 1")
        if not 0 < fill_target <= 1:
            raise ValueError(f"fill_target must be in (0, 1], got {fill_target}")
        self._max_inputs, self._max_tokens = max_inputs, max_tokens
        self._full_tokens = fill_target * max_tokens
        self._max_open = max_open_bins
        self._open: list[_Bin] = []

    def add(self, item: Any, n_tokens: int) -> list[list[Any]]:
        """Place the item; returns the requests this closed (usually none, at most one)."""
        if n_tokens < 0:
            raise ValueError(f"n_tokens must be >= 0, got {n_tokens}")
        if n_tokens > self._max_tokens:
            return [[item]]
        # open requests always have an input free: a request reaching max_inputs closes at once
        request = self._first_fit(self._open, n_tokens)
        request.put(item, n_tokens)
        if request.tokens >= self._full_tokens or len(request.items) >= self._max_inputs:
            self._open.remove(request)
            return [request.items]
        if len(self._open) > self._max_open:
            fullest = max(self._open, key=self._fill)
            self._open.remove(fullest)
            return [fullest.items]
        return []

    def flush(self) -> list[list[Any]]:
        """What the open requests hold, packed again first-fit decreasing (the tail of a bundle
        is where requests would otherwise go out half empty); the packer is empty afterwards."""
        left = sorted(((n, i, item) for r in self._open for i, (item, n) in enumerate(zip(r.items, r.sizes, strict=True))),
                      key=lambda e: -e[0])
        self._open = []
        packed: list[_Bin] = []
        for n, _, item in left:
            self._first_fit(packed, n).put(item, n)
        return [r.items for r in packed]

    def _first_fit(self, requests: list[_Bin], n_tokens: int) -> _Bin:
        """The first request with room for N_TOKENS and an input, else a new one appended."""
        request = next((r for r in requests if r.tokens + n_tokens <= self._max_tokens
                        and len(r.items) < self._max_inputs), None)
        if request is None:
            request = _Bin()
            requests.append(request)
        return request

    def _fill(self, request: _Bin) -> float:
        return max(request.tokens / self._max_tokens, len(request.items) / self._max_inputs)


class _PackDoFn(beam.DoFn):
    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float, max_open: int):
        self._limits = (max_inputs, max_tokens, fill_target, max_open)
        self._requests = Metrics.counter("embedpipe", "requests_packed")

    def start_bundle(self):
        max_inputs, max_tokens, fill_target, max_open = self._limits
        self._packer = Packer(max_inputs, max_tokens, fill_target=fill_target, max_open_bins=max_open)
        self._stored: list[StoredItem] = []

    def process(self, item):
        if isinstance(item, StoredItem):   # taken from the store: batched as they come, never sent
            self._stored.append(item)
            if len(self._stored) >= STORED_PER_BATCH:
                yield Request(self._stored)
                self._stored = []
            return
        for request in self._packer.add(item, item.n_tokens):
            self._requests.inc()
            yield Request(request)

    def finish_bundle(self):
        for request in self._packer.flush():
            self._requests.inc()
            yield WindowedValue(Request(request), MIN_TIMESTAMP, (GlobalWindow(),))
        if self._stored:
            yield WindowedValue(Request(self._stored), MIN_TIMESTAMP, (GlobalWindow(),))


class PackRequests(beam.PTransform):
    """TextItem -> Request (a tuple of TextItems), one per embeddings request; StoredItems pass
    in batches of their own."""

    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float, max_open: int):
        super().__init__()
        self._fn = _PackDoFn(max_inputs, max_tokens, fill_target, max_open)

    def expand(self, items):
        return items | "Pack" >> beam.ParDo(self._fn).with_output_types(Request)


def request_totals(requests):
    """(requests, inputs, rows, tokens) over all packed requests (plan's figures)."""
    return (requests
            | "RequestTotals" >> beam.Map(lambda r: (1, len(r), sum(len(i.refs) for i in r),
                                                     sum(i.n_tokens for i in r)))
            | "SumTotals" >> beam.CombineGlobally(lambda rows: tuple(map(sum, zip(*rows, strict=True))) or (0, 0, 0, 0)))

"""Pack: distinct texts -> requests within the model's input and token caps, ≥ fill_target full
whenever enough texts wait in the bundle (Beam's BatchElements cannot weigh by tokens)."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.transforms.window import GlobalWindow
from apache_beam.utils.timestamp import MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

from transforms.packing import Packer


class _PackDoFn(beam.DoFn):
    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float, max_open: int):
        self._limits = (max_inputs, max_tokens, fill_target, max_open)
        self._requests = Metrics.counter("embedpipe", "requests_packed")

    def start_bundle(self):
        max_inputs, max_tokens, fill_target, max_open = self._limits
        self._packer = Packer(max_inputs, max_tokens, fill_target=fill_target, max_open_bins=max_open)

    def process(self, item):
        for request in self._packer.add(item, item.n_tokens):
            self._requests.inc()
            yield tuple(request)

    def finish_bundle(self):
        for request in self._packer.flush():
            self._requests.inc()
            yield WindowedValue(tuple(request), MIN_TIMESTAMP, [GlobalWindow()])


class PackRequests(beam.PTransform):
    """TextItem -> tuple of TextItems, one per embeddings request."""

    def __init__(self, max_inputs: int, max_tokens: int, fill_target: float, max_open: int):
        super().__init__()
        self._fn = _PackDoFn(max_inputs, max_tokens, fill_target, max_open)

    def expand(self, items):
        return items | "Pack" >> beam.ParDo(self._fn)


def request_totals(requests):
    """(requests, inputs, rows, tokens) over all packed requests (plan's figures)."""
    return (requests
            | "RequestTotals" >> beam.Map(lambda r: (1, len(r), sum(len(i.refs) for i in r),
                                                     sum(i.n_tokens for i in r)))
            | "SumTotals" >> beam.CombineGlobally(lambda rows: tuple(map(sum, zip(*rows))) or (0, 0, 0, 0)))

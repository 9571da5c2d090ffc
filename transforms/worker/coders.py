"""Coders of the large elements between steps: Arrow tables, packed requests, and the library's
output rows (a numpy vector and a datetime each, which the default coder pickles).

Beam samples the byte size of the elements passing each step (the first ten of every
PCollection, then ever more sparsely) by encoding them, and its default coder pickles: a whole
table (4 MB of vectors) or request (1 MB of text) copied just to be counted, 2-3% of the
client CPU on 20,000 documents. These coders size an element from what it holds; their
encodings (Arrow IPC, pickle) run only where an element crosses a stage boundary.
"""
from __future__ import annotations

import pickle

import apache_beam as beam
import pyarrow as pa

import numpy as np

from transforms.records import Request, Row

TEXT_ITEM_OVERHEAD = 200   # bytes of a TextItem besides its text: digest, counts, row refs
FIELD_BYTES = 16           # a Row's field besides a string's or vector's own bytes: name, number, timestamp


class ArrowTableCoder(beam.coders.Coder):
    def encode(self, table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    def decode(self, data: bytes) -> pa.Table:
        return pa.ipc.open_stream(data).read_all()

    def estimate_size(self, table: pa.Table) -> int:
        return table.nbytes

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return pa.Table


class RequestCoder(beam.coders.Coder):
    def encode(self, request: Request) -> bytes:
        return pickle.dumps(tuple(request), pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Request:
        return Request(pickle.loads(data))

    def estimate_size(self, request: Request) -> int:
        return sum(len(item.text) + TEXT_ITEM_OVERHEAD for item in request)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return Request


class RowCoder(beam.coders.Coder):
    def encode(self, row: Row) -> bytes:
        return pickle.dumps(dict(row), pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes) -> Row:
        return Row(pickle.loads(data))

    def estimate_size(self, row: Row) -> int:
        return sum(FIELD_BYTES + (v.nbytes if isinstance(v, np.ndarray) else len(v) if isinstance(v, str) else 0)
                   for v in row.values())

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return Row


beam.coders.registry.register_coder(pa.Table, ArrowTableCoder)
beam.coders.registry.register_coder(Row, RowCoder)
beam.coders.registry.register_coder(Request, RequestCoder)

"""The coders of tables, requests and the library's rows: exact round trips where an element crosses a stage
boundary, and sizes taken from what an element holds, never from encoding it."""
from __future__ import annotations

import datetime as dt

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from transforms import schemas
from transforms.records import ChunkRef, Request, Row, TextItem
from transforms.worker import coders


def _table() -> pa.Table:
    schema = schemas.embeddings(4, [pa.field("lang", pa.string())], schemas.metadata("m", 4, "run-1"))
    n = 3
    columns = {f.name: pa.nulls(n, f.type) for f in schema}
    columns.update({
        "doc_id": pa.array(["a", "b", "c"]), "chunk_index": pa.array([0, 1, 2], pa.int32()),
        "embedding": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(12, dtype=np.float32)),
                                                       type=schema.field("embedding").type),
        "lang": pa.array(["en", None, "ru"])})
    return pa.Table.from_arrays([columns[f.name].cast(f.type) for f in schema], schema=schema)


def _request() -> Request:
    ref = ChunkRef("doc", 0, 1, 0, 3, 3, ("en",))
    return Request(TextItem(f"{i:064x}", "текст " * (i + 1), 3, (ref,)) for i in range(3))


def _row() -> Row:
    return Row(doc_id="a", chunk_index=0, cost_rub=0.25, request_id=None,
               embedded_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC), embedding=np.arange(4, dtype=np.float32))


def test_the_registry_gives_these_coders():
    assert isinstance(beam.coders.registry.get_coder(pa.Table), coders.ArrowTableCoder)
    assert isinstance(beam.coders.registry.get_coder(Request), coders.RequestCoder)
    assert isinstance(beam.coders.registry.get_coder(Row), coders.RowCoder)


def test_a_row_survives_the_round_trip_as_a_row():
    row, coder = _row(), coders.RowCoder()
    back = coder.decode(coder.encode(row))
    assert type(back) is Row and back.keys() == row.keys() and np.array_equal(back.pop("embedding"),
                                                                             row.pop("embedding"))
    assert back == row


def test_a_table_survives_the_round_trip_with_its_schema():
    table, coder = _table(), coders.ArrowTableCoder()
    back = coder.decode(coder.encode(table))
    assert back.equals(table) and back.schema.equals(table.schema, check_metadata=True)
    assert not back.schema.field("embedding").nullable


def test_a_request_survives_the_round_trip_as_a_request():
    request, coder = _request(), coders.RequestCoder()
    back = coder.decode(coder.encode(request))
    assert type(back) is Request and back == request


def test_sizes_come_from_the_contents_without_encoding(monkeypatch):
    table, request = _table(), _request()

    def refuse(*args, **kwargs):
        raise AssertionError("sized by encoding")

    monkeypatch.setattr(coders.ArrowTableCoder, "encode", refuse)
    monkeypatch.setattr(coders.RequestCoder, "encode", refuse)
    monkeypatch.setattr(coders.RowCoder, "encode", refuse)
    assert coders.ArrowTableCoder().estimate_size(table) == table.nbytes
    texts = sum(len(i.text) for i in request)
    assert coders.RequestCoder().estimate_size(request) == texts + 3 * coders.TEXT_ITEM_OVERHEAD
    assert coders.RowCoder().estimate_size(_row()) == 6 * coders.FIELD_BYTES + len("a") + 4 * 4


@pytest.mark.parametrize("element", [_table(), _request(), _row()], ids=["table", "request", "row"])
def test_beams_own_sampling_uses_the_cheap_size(element, monkeypatch):
    """What the runner calls on every sampled element: the coder impl's size estimate."""
    coder = beam.coders.registry.get_coder(type(element))
    monkeypatch.setattr(type(coder), "encode", lambda self, value: pytest.fail("sized by encoding"))
    size, observables = coder.get_impl().get_estimated_size_and_observables(element)
    assert size == coder.estimate_size(element) and not observables

"""Every output file kind declares the columns the contract guarantees as required, and the
vector's elements as non-nullable (design.md, "Contract: outputs"): readers may rely on what is
declared, and ClickHouse refuses vector functions on Array(Nullable(Float32))."""
from __future__ import annotations

import pickle

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.internal import pickler

from transforms import schemas
from transforms.dedupe.known import _journal_refs, read_vectors
from transforms.money import journal
from transforms.write.docvectors import documents_schema

DIMS = 8
META = schemas.metadata("m", DIMS, "run-1")
KEPT = (pa.field("lang", pa.string()), pa.field("source", pa.string(), nullable=False))

# The only columns that may be null; kept columns keep the input's nullability.
NULLABLE = {"failed": {"doc_id", "chunk_index"}, "requests": {"balance_after"}}
SCHEMAS = {"embeddings": schemas.embeddings(DIMS, KEPT, META), "pending": schemas.pending(KEPT, META),
           "requests": schemas.REQUESTS, "failed": schemas.FAILED, "documents": documents_schema(DIMS, META)}


def assert_declared(kind: str, schema: pa.Schema, kept=KEPT) -> None:
    kept_nullable = {f.name: f.nullable for f in kept}
    for field in schema:
        expected = kept_nullable.get(field.name, field.name in NULLABLE.get(kind, ()))
        assert field.nullable == expected, f"{kind}.{field.name}: nullable={field.nullable}"
    if "embedding" in schema.names:
        vector = schema.field("embedding").type
        assert pa.types.is_fixed_size_list(vector) and vector.value_type == pa.float32()
        assert not vector.value_field.nullable, f"{kind}.embedding has nullable elements"


@pytest.mark.parametrize("kind", SCHEMAS)
def test_guaranteed_columns_are_required(kind):
    assert_declared(kind, SCHEMAS[kind])


@pytest.mark.parametrize("dumps,loads", [(pickle.dumps, pickle.loads), (pickler.dumps, pickler.loads)],
                         ids=["pickle", "beam"])
@pytest.mark.parametrize("kind", SCHEMAS)
def test_schemas_survive_pickling_into_beam_sinks(kind, dumps, loads):
    assert loads(dumps(SCHEMAS[kind])).equals(SCHEMAS[kind], check_metadata=True)


def _journal_entry(tmp_path, run_id="run-1", request_id="r1"):
    vectors = np.arange(2 * DIMS, dtype=np.float32).reshape(2, DIMS)
    row = {"request_id": request_id, "model": "m", "balance_after": None}
    return journal.write_entry(str(tmp_path), run_id, row, ["a" * 64, "b" * 64], [3, 4], vectors, [10, 20])


def test_journal_entries_are_required_and_hold_each_vector_as_its_float32_bytes(tmp_path):
    schema = pq.read_schema(_journal_entry(tmp_path))
    assert not any(f.nullable for f in schema)
    assert schema.field("embedding").type == pa.binary(4 * DIMS)
    row, shas, shares, vectors = journal.read_entry(str(tmp_path), "run-1", "r1")
    assert (row["request_id"], shas, shares) == ("r1", ["a" * 64, "b" * 64], [10, 20])
    assert vectors.dtype == np.float32 and vectors.tolist() == np.arange(2 * DIMS).reshape(2, DIMS).tolist()


def _as_float_lists(path, nullable: bool):
    """Rewrite an entry as earlier versions wrote it: vectors as float lists (once nullable)."""
    new = pq.read_table(path)
    vectors = journal.entry_vectors(new)
    fields = [pa.field(f.name, f.type, nullable) for f in new.schema if f.name != "embedding"]
    value = pa.field("item", pa.float32(), nullable)
    fields.append(pa.field("embedding", pa.list_(value, DIMS), nullable))
    old = pa.Table.from_arrays([*new.columns[:-1], pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.reshape(-1)), type=pa.list_(value, DIMS))],
        schema=pa.schema(fields, metadata=new.schema.metadata))
    pq.write_table(old, path)


@pytest.mark.parametrize("nullable", [True, False], ids=["nullable", "required"])
def test_a_journal_written_by_an_earlier_version_is_still_read(tmp_path, nullable):
    path = _journal_entry(tmp_path)
    _as_float_lists(path, nullable)
    assert pa.types.is_fixed_size_list(pq.read_schema(path).field("embedding").type)
    paths, rows = journal.unwritten(str(tmp_path), set(), "m", DIMS)
    assert [r["request_id"] for r in rows] == ["r1"]
    known = [pair for path in paths for pair in _journal_refs(path)]
    assert [(sha, k.share_micro, k.request_id) for sha, k in known] == [("a" * 64, 10, "r1"), ("b" * 64, 20, "r1")]
    ref = known[1][1]
    assert read_vectors(ref.path, ref.row_group, ref.journaled)[ref.row].tolist() == list(range(DIMS, 2 * DIMS))
    assert journal.read_entry(str(tmp_path), "run-1", "r1")[3].tolist() == np.arange(2 * DIMS).reshape(2, DIMS).tolist()
    assert journal.unwritten(str(tmp_path), set(), "m", DIMS + 1) == ([], [])   # other dimensions
    assert journal.unwritten(str(tmp_path), {"r1"}, "m", DIMS) == (paths, [])   # its request row is written

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

from transforms import journal, schemas
from transforms.docvectors import documents_schema

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


def test_journal_entries_are_required_too(tmp_path):
    schema = pq.read_schema(_journal_entry(tmp_path))
    assert not any(f.nullable for f in schema)
    assert not schema.field("embedding").type.value_field.nullable


def test_a_journal_written_before_the_change_is_still_read(tmp_path):
    """An entry whose columns and elements are nullable, as every entry was before."""
    path = _journal_entry(tmp_path)
    new = pq.read_table(path)
    old_schema = pa.schema([pa.field("text_sha256", pa.string()), pa.field("n_tokens", pa.int32()),
                            pa.field("share_micro", pa.int64()),
                            pa.field("embedding", pa.list_(pa.float32(), DIMS))], metadata=new.schema.metadata)
    pq.write_table(new.cast(old_schema), path)
    assert pq.read_schema(path).field("embedding").type.value_field.nullable
    known, rows = journal.load_unwritten(str(tmp_path), set(), "m", DIMS)
    assert [r["request_id"] for r in rows] == ["r1"]
    assert [(sha, k.share_micro) for sha, k in known] == [("a" * 64, 10), ("b" * 64, 20)]
    assert np.frombuffer(known[1][1].vector, dtype="<f4").tolist() == list(range(DIMS, 2 * DIMS))

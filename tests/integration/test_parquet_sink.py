"""WriteTables: the Parquet sink of every output, on a real Beam pipeline."""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq

from transforms.write.transform import Codec, WriteTables

SCHEMA = pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32()))])


def _write(out, tables, part=None):
    with beam.Pipeline() as p:
        p | beam.Create(tables) | WriteTables(str(out), "embeddings", "r1", SCHEMA, Codec(), part=part)


def _table(ids):
    return pa.table({"id": ids, "vector": [[1.0, 2.0]] * len(ids)}, schema=SCHEMA)


def test_a_sink_leaves_the_files_of_its_sibling_part(tmp_path):
    """Beam's sink deletes what matches its own final names before renaming, and
    `embeddings-r1-*-of-00001` matches `embeddings-r1-reused-00000-of-00001`: whichever of the
    two sinks finished second used to delete the other's rows."""
    _write(tmp_path, [_table(["a", "b"])], part="reused")
    _write(tmp_path, [_table(["c"])])
    files = sorted(f.name for f in tmp_path.glob("embeddings-*.parquet"))
    assert files == ["embeddings-r1-00000-of-00001.parquet", "embeddings-r1-reused-00000-of-00001.parquet"]
    ids = sorted(i for f in files for i in pq.read_table(tmp_path / f)["id"].to_pylist())
    assert ids == ["a", "b", "c"]

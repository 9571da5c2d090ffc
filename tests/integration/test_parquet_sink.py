"""WriteOutputs: the Parquet files of every output, on a real Beam pipeline."""
from __future__ import annotations

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transforms.write.transform import Codec, Output, WriteOutputs, _NameFiles

SCHEMA = pa.schema([("id", pa.string()), ("vector", pa.list_(pa.float32()))])
ROWS = pa.schema([("id", pa.string()), ("n", pa.int64()), ("run_id", pa.string())])


def _write(out, collections: dict, outputs: dict):
    with beam.Pipeline() as p:
        pcolls = {label: p | f"Create{label}" >> beam.Create(elements, reshuffle=False)
                  for label, elements in collections.items()}
        pcolls | WriteOutputs(str(out), "r1", Codec(), outputs)


def _table(ids):
    return pa.table({"id": ids, "vector": [[1.0, 2.0]] * len(ids)}, schema=SCHEMA)


def _names(path, pattern="*.parquet"):
    return sorted(f.name for f in path.glob(pattern))


def test_every_output_gets_its_files_and_nothing_temporary_is_left(tmp_path):
    _write(tmp_path, {"Vectors": [_table(["a", "b"]), _table(["c"])],
                      "Reused": [_table(["d"])],
                      "Rows": [{"id": str(i), "n": i} for i in range(12001)],
                      "Nothing": []},
           {"Vectors": Output("embeddings", SCHEMA), "Reused": Output("embeddings", SCHEMA, part="reused"),
            "Rows": Output("requests", ROWS, rows=True, extra={"run_id": "r1"}),
            "Nothing": Output("failed", ROWS, rows=True)})
    names = _names(tmp_path)
    assert [n for n in names if n.startswith("embeddings-r1-reused-")] == ["embeddings-r1-reused-00000-of-00001.parquet"]
    vectors = [n for n in names if n.startswith("embeddings-r1-0")]
    assert vectors and all(n.endswith(f"-of-{len(vectors):05d}.parquet") for n in vectors)
    assert sorted(i for n in vectors for i in pq.read_table(tmp_path / n)["id"].to_pylist()) == ["a", "b", "c"]
    rows = pa.concat_tables(pq.read_table(tmp_path / n) for n in names if n.startswith("requests-"))
    assert sorted(rows["n"].to_pylist()) == list(range(12001)) and set(rows["run_id"].to_pylist()) == {"r1"}
    # no rows still gives one file with the schema, for glob readers
    assert [n for n in names if n.startswith("failed-")] == ["failed-r1-00000-of-00001.parquet"]
    empty = pq.read_table(tmp_path / "failed-r1-00000-of-00001.parquet")
    assert empty.num_rows == 0 and empty.schema.names == ROWS.names
    assert sorted(p.name for p in tmp_path.iterdir()) == names   # the temporary directory is gone


def test_naming_again_after_a_partial_rename_skips_what_is_done(tmp_path):
    """A finalising step retried after it renamed part of the files: the rest are renamed, the
    renamed ones are kept, a failed bundle's leftover file is deleted."""
    temp = tmp_path / ".temp-x"
    temp.mkdir()
    for name in ("a", "b", "failed-bundle"):
        pq.write_table(_table([name]), temp / f"{name}.parquet")
    (temp / "a.parquet").rename(tmp_path / "embeddings-r1-00000-of-00002.parquet")   # the first try got this far
    prefix = str(tmp_path / "embeddings-r1")
    name = _NameFiles({prefix: Output("embeddings", SCHEMA)}, str(temp), Codec())
    done = list(name.process(None, [(prefix, str(temp / "b.parquet")), (prefix, str(temp / "a.parquet"))]))
    assert [d.rsplit("/", 1)[1] for d in done] == ["embeddings-r1-00000-of-00002.parquet",
                                                    "embeddings-r1-00001-of-00002.parquet"]
    assert _names(tmp_path) == ["embeddings-r1-00000-of-00002.parquet", "embeddings-r1-00001-of-00002.parquet"]
    assert pq.read_table(tmp_path / "embeddings-r1-00001-of-00002.parquet")["id"].to_pylist() == ["b"]
    assert not temp.exists()


def test_a_written_file_that_is_gone_is_an_error_not_a_silent_loss(tmp_path):
    temp = tmp_path / ".temp-x"
    temp.mkdir()
    prefix = str(tmp_path / "embeddings-r1")
    name = _NameFiles({prefix: Output("embeddings", SCHEMA)}, str(temp), Codec())
    with pytest.raises(OSError, match="is gone"):
        list(name.process(None, [(prefix, str(temp / "lost.parquet"))]))


def test_outputs_and_collections_must_match(tmp_path):
    with pytest.raises(ValueError, match="differ"):
        _write(tmp_path, {"A": [_table(["a"])]}, {"B": Output("embeddings", SCHEMA)})
    with pytest.raises(ValueError, match="same files"):
        WriteOutputs(str(tmp_path), "r1", Codec(), {"A": Output("embeddings", SCHEMA), "B": Output("embeddings", SCHEMA)})

"""The publish's pure logic: names refused or read, the rows' binary form, the bucket the
server computes, the delta between two views' keys."""
from __future__ import annotations

import os
import re
import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.exits import UsageError
from pipeline.publish import delta
from pipeline.publish.embedded import shared_buffers_mb
from pipeline.publish.index import Index, work_mem_mb
from pipeline.publish.target import TableName, parse_table, parse_url
from pipeline.settings.config import PublishSettings
from transforms.publish.columns import BUCKETS, bucket_of, columns, hash_sql
from transforms.publish.rows import copy_rows, vector_payloads


def test_table_names_are_plain_identifiers_or_refused():
    assert parse_table("Embeddings") == TableName(None, "embeddings")
    assert parse_table("corpus.chunks_2") == TableName("corpus", "chunks_2")
    for bad in ('x"; drop table y; --', "a.b.c", "1a", "a b", "", "x" * 64, "a-b", "ü"):
        with pytest.raises(UsageError):
            parse_table(bad)


def test_a_url_with_a_password_is_refused_without_echo_and_shown_without_one():
    for url in ("postgresql://u:hunter2@h/db", "postgresql://u@h/db?password=hunter2"):
        with pytest.raises(UsageError) as caught:
            parse_url(url)
        assert "hunter2" not in str(caught.value) and "PGPASSFILE" in str(caught.value)
    db = parse_url("postgresql://u@h:5433/db?sslmode=require")
    assert db.shown == "postgresql://u@h:5433/db" and "sslmode" in db.url
    assert parse_url("postgresql://postgres@/db?host=/tmp/s").shown == "postgresql://postgres@/db?host=/tmp/s"


def test_vectors_go_in_pgvector_binary_form_bit_for_bit():
    v = np.array([[1.5, -0.0, np.float32(1e-45), 3.4e38], [0.1, 0.2, 0.3, 0.4]], np.float32)
    column = pa.FixedSizeListArray.from_arrays(pa.array(v.ravel(), pa.float32()), 4)
    payloads = vector_payloads(column, 4)
    for row, payload in zip(v, payloads, strict=True):
        assert struct.unpack(">HH", payload[:4]) == (4, 0)
        assert np.frombuffer(payload[4:], ">f4").astype(np.float32).tobytes() == row.tobytes()
    with pytest.raises(ValueError):
        vector_payloads(column, 3)


def test_rows_follow_the_columns_and_costs_read_back_exactly():
    cols = columns([pa.field("lang", pa.string())], 2)
    table = pa.table({c.name: [] for c in cols})  # the order of columns() drives the rows
    assert [c.name for c in cols][:3] == ["doc_id", "chunk_index", "chunk_count"]
    assert cols[8].type == "vector(2)" and cols[-1].type == "text"
    data = {"doc_id": ["a"], "chunk_index": [0], "chunk_count": [1], "token_start": [0], "token_end": [3],
            "n_tokens": [3], "text_sha256": ["f" * 64], "model": ["m"],
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array([1.0, 2.0], pa.float32()), 2),
            "request_id": ["r"], "cost_rub": [0.1 + 0.2], "run_id": ["x"],
            "embedded_at": pa.array([0], pa.timestamp("us", "UTC")), "lang": ["en"]}
    table = pa.table(data)
    (row,) = list(copy_rows(table, cols, 2))
    assert float(row[10]) == 0.1 + 0.2 and row[-1] == "en"
    assert "vector_send" in hash_sql(cols, lambda n: f'"{n}"')


def test_buckets_and_the_index_expression():
    assert 0 <= bucket_of("doc", 0, 0) < BUCKETS
    assert len({bucket_of(f"d{i}", 0, 0) for i in range(2000)}) > 1000
    assert (Index(1536).indexed, Index(1536).opclass) == ("embedding", "vector_cosine_ops")
    assert Index(3072).indexed == "(((embedding::vector))::halfvec(3072))" and Index(3072).key("q") == "(q)::halfvec(3072)"
    assert Index(4096).indexed == "((subvector((embedding::vector), 1, 4000))::halfvec(4000))" and Index(4096).reranks
    assert Index(2000).kind == "vector" and Index(4000).kind == "halfvec" and Index(4001).kind == "prefix"
    assert Index(3072).lacking_in("0.6.2") == "halfvec type (0.7.0)" and Index(1536).lacking_in("0.6.2") is None
    assert Index(1536).lacking_in("0.4.4") and Index(4096).lacking_in("0.8.0") is None
    s = PublishSettings()
    assert 64 <= work_mem_mb(1000, Index(1536), s) <= work_mem_mb(200_000, Index(1536), s) == s.maintenance_work_mem_mb


def test_the_embedded_servers_shared_buffers_are_the_setting_up_to_a_quarter_of_the_memory():
    memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2 ** 20
    assert shared_buffers_mb(64) == 64
    assert 0 < shared_buffers_mb(10 ** 9) <= memory_mb // 4


def _keys(rows) -> pa.Table:
    """(doc, chunk, start, run, row) -> delta.ROWS with file 0, group 0, one text and request."""
    n = len(rows)
    return pa.table([pa.array([r[0] for r in rows], pa.string()), pa.array([r[1] for r in rows], pa.int32()),
                     pa.array([r[2] for r in rows], pa.int32()), pa.array([r[3] for r in rows], pa.string()),
                     pa.array(["f" * 64] * n, pa.string()), pa.array(["q"] * n, pa.string()),
                     pa.array([0] * n, pa.int32()), pa.array([0] * n, pa.int32()),
                     pa.array([r[4] for r in rows], pa.int32())], schema=delta.ROWS)


def test_the_delta_writes_what_changed_and_deletes_what_left():
    old = _keys([("a", 0, 0, "run1", 0), ("b", 0, 0, "run1", 1), ("c", 0, 0, "run1", 2)])
    new = _keys([("a", 0, 0, "run1", 0), ("b", 0, 0, "run2", 1), ("d", 0, 0, "run1", 2)])
    writes, gone = delta.diff(old, new, None, [])
    assert sorted(writes.column("doc_id").to_pylist()) == ["b", "d"]
    assert gone.column("doc_id").to_pylist() == ["c"]
    tasks = delta.tasks_of(writes, ["f.parquet"])
    assert [(t.path, t.group, np.frombuffer(t.rows, np.int32).tolist()) for t in tasks] == [("f.parquet", 0, [1, 2])]
    # a drifted bucket: every row of the view in it is written again, none of it is deleted by key
    bucket = bucket_of("a", 0, 0)
    writes, gone = delta.diff(old, new, new, [bucket])
    assert "a" in writes.column("doc_id").to_pylist()


def test_keys_are_placed_by_file_row_group_and_row(tmp_path):
    rows = [{"doc_id": f"d{i}", "chunk_index": i % 2, "token_start": 0, "run_id": "r", "text_sha256": "t",
             "request_id": f"q{i}"} for i in range(7)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=3)
    pq.write_table(pa.Table.from_pylist(rows[:2]), tmp_path / "b.parquet")
    keys = delta.read_keys([str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")])
    assert keys.column("doc_id").to_pylist() == [f"d{i}" for i in (*range(7), 0, 1)]
    assert list(zip(keys.column("file").to_pylist(), keys.column("group").to_pylist(),
                    keys.column("row").to_pylist(), strict=True)) == \
        [(0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 1, 1), (0, 1, 2), (0, 2, 0), (1, 0, 0), (1, 0, 1)]
    served = delta.table_keys([[(r["doc_id"], r["chunk_index"], 0, "r", "t", r["request_id"]) for r in rows[:4]]])
    assert served.column("request_id").to_pylist() == ["q0", "q1", "q2", "q3"]
    assert sorted(delta.diff(served, keys, None, [])[0].column("doc_id").to_pylist()) == ["d4", "d5", "d6"]


def _fails(exc: Exception) -> None:
    raise exc


@pytest.mark.parametrize("mode", ["in_memory", "multi_processing"])
def test_a_workers_database_error_reaches_the_launcher_as_its_class(mode):
    """A runner hands a worker's exception over as text; the database error's class survives it."""
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions
    from psycopg import errors

    from pipeline.runner import make_runner
    from transforms.publish.load import database_error, load_failed

    for raised, want in ((errors.DiskFull("could not extend file \"base/1/2\": No space left on device"),
                          errors.DiskFull), (RuntimeError("not the database's"), None)):
        opts = PipelineOptions(["--direct_running_mode", mode, "--direct_num_workers", "1"])
        pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
        error = load_failed(raised) if want else raised
        _ = pipeline | beam.Create([1]) | "Load" >> beam.Map(lambda _, e=error: _fails(e))
        with pytest.raises(Exception) as failed:
            pipeline.run().wait_until_finish()
        carried = database_error(failed.value)
        if want is None:
            assert carried is None
        else:
            assert type(carried) is want and "No space left on device" in str(carried)


def test_a_database_error_says_publish_again_only_where_trying_again_can_help():
    from psycopg import errors

    from pipeline.publish.failure import failure
    from pipeline.publish.target import Database
    db = Database("", "postgresql://u@h/db")

    def told(state: str, message: str) -> str:
        return failure(errors.lookup(state)(message), db, "s.t")
    assert told("54000", "index row requires 9000 bytes").endswith("publishing the same view meets the limit again")
    assert told("22P02", "invalid input syntax").endswith("it serves what it did before")
    assert "lower publish.maintenance_work_mem_mb" in told("53200", "out of memory")
    assert "free space there, then publish again" in told("53100", "could not extend file")
    assert "was lost" not in told("57014", "canceling statement due to statement timeout")
    for state in ("08006", "57P01", "40P01", "55P03", "53300"):
        assert told(state, "x").endswith(": publish again"), state
    assert told("08006", "server closed the connection").startswith("publishing to s.t failed: the connection to "
                                                                    "postgresql://u@h/db was lost")
    for state in ("XX000", "42P01", "23505"):
        assert "publish again" not in told(state, "x"), state


def test_the_operations_guide_counts_the_buckets_the_code_has():
    guide = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    assert re.findall(r"in N of ([\d,]+) buckets", guide) == [f"{BUCKETS}"]


def test_a_password_anywhere_in_a_url_is_refused_and_never_shown():
    for url in ("postgresql://u@h/db?dbname=postgresql://x:hunter2@h/d",
                "postgresql://u@h/?dbname=postgresql%3A%2F%2Fx%3Ahunter2%40h%2Fd",
                "postgresql://u@h/?dbname=host%3Dh%20password%3Dhunter2",
                "postgresql://u@h/?dbname=host%253Dh%2520password%253Dhunter2",
                "postgresql://u@h/?options=postgresql://x:hunter2@h/d", "postgresql://u@h/?%70assword=hunter2"):
        with pytest.raises(UsageError) as caught:
            parse_url(url)
        assert "hunter2" not in str(caught.value) and "a password" in str(caught.value), url
    with pytest.raises(UsageError) as caught:
        parse_url("postgresql://u@h/?dbname=host%3Dh%20sslpassword%3Dhunter2")
    assert "sslpassword (in its dbname parameter)" in str(caught.value) and "hunter2" not in str(caught.value)
    shown = parse_url("postgresql://u@h/?dbname=postgresql://x@h2/d").shown
    assert shown == "postgresql://u@h/(a connection string)"
    assert parse_url("postgresql://u@h/db?options=-c%20search_path%3Dx").shown == "postgresql://u@h/db"

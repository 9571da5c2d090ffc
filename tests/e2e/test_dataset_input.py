"""`run --input DIR` on a hive-partitioned dataset as Spark writes it, with the partition key
kept as a column and integer ids that come back as strings. The job reads through ReadParquetTables (transforms/read/parquet.py)."""
from __future__ import annotations

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import read_kind, run
from tests.integration.test_parquet_source import ROWS, spark_layout

MODEL = "text-embedding-3-small"


def test_run_on_a_spark_dataset_keeps_the_partition_key(tmp_path, sandbox, monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    root = spark_layout(tmp_path / "dataset")
    out = tmp_path / "out"
    assert run("--input", str(root), "--output", str(out), "--model", MODEL, "--base-url", sandbox.base_url,
               "--keep-columns", "lang") == 0
    rows = read_kind(out, "embeddings").select(["doc_id", "lang"]).to_pylist()
    assert sorted((r["doc_id"], r["lang"]) for r in rows) == sorted((str(i), lang) for i, _, lang in ROWS)

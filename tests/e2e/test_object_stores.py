"""s3:// for real: an S3-compatible server (moto's server mode) on 127.0.0.1 and Beam's own S3
filesystem, pointed at it with Beam's options (--s3_endpoint_url, --s3_region_name), the keys
from the environment as boto3 reads them. Every path of the job is on it: the corpus, the
model catalogue, the output, the resume, --known and the report.

Needs the `aws` extra (boto3) and moto with flask, all in the `test` extra; skipped only when
they are not installed.
"""
from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipeline.cli import main
from pipeline.inputs import inspect_input
from pipeline.options import use_filesystems
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, ledger, micro,
                                     start_sandbox, write_corpus, write_models)
from transforms.apportion import from_micro
from transforms.source import ReadParquetTables

boto3 = pytest.importorskip("boto3")
threaded_server = pytest.importorskip("moto.moto_server.threaded_moto_server")

BUCKET = "corp"


@pytest.fixture
def s3(monkeypatch):
    """(the S3 client, Beam's S3 flags) for a fresh bucket on a moto server on loopback."""
    for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                        ("AWS_CONFIG_FILE", "/dev/null"), ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")):
        monkeypatch.setenv(name, value)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 call otherwise
    server = threaded_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=BUCKET)
    yield client, ["--s3_endpoint_url", endpoint, "--s3_region_name", "us-east-1"]
    server.stop()


def upload(client, local: Path, key: str) -> str:
    client.upload_file(str(local), BUCKET, key)
    return f"s3://{BUCKET}/{key}"


def mirror(client, prefix: str, into: Path) -> Path:
    """Every object under PREFIX, downloaded to INTO (to check with the local helpers)."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        for obj in page.get("Contents", []):
            target = into / obj["Key"][len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(BUCKET, obj["Key"], str(target))
    return into


def test_run_resume_known_and_report_on_s3(tmp_path, s3, sandbox_factory, monkeypatch, capsys):
    client, flags = s3
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    rows = corpus_rows(n_short=60, n_long=2)
    for i, part in enumerate((rows[::2], rows[1::2])):
        upload(client, write_corpus(tmp_path / f"part-{i}.parquet", part), f"in/part-{i}.parquet")
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)

    def run(output: str, *extra: str) -> int:
        return main(["run", "--output", output, "--model", MODEL, "--base-url", sb.base_url,
                     "--models-config", upload(client, models, "conf/models.yaml"), *flags, *extra])

    corpus = f"s3://{BUCKET}/in/*.parquet"
    assert run(f"s3://{BUCKET}/out", "--input", corpus, "--max-spend-rub", "0.2", "--allow-partial") == 4
    partial = len(ledger(sb))
    assert partial > 0
    assert run(f"s3://{BUCKET}/out", "--resume") == 0           # the pending rows, without the corpus
    assert run(f"s3://{BUCKET}/out", "--resume", "--input", corpus) == 0  # nothing left to pay
    charges = ledger(sb)
    assert len(charges) > partial and not billed_twice(charges)
    out = mirror(client, "out/", tmp_path / "out")
    assert assert_every_row_once(out, rows)["pending"] == 0
    assert not any(out.glob("_journal/*/*"))

    assert run(f"s3://{BUCKET}/again", "--input", corpus, "--known", f"s3://{BUCKET}/out/embeddings-*.parquet") == 0
    assert len(ledger(sb)) == len(charges)  # every vector reused, nothing paid
    assert assert_every_row_once(mirror(client, "again/", tmp_path / "again"), rows)["embeddings"] > 0

    capsys.readouterr()
    assert main(["report", f"s3://{BUCKET}/out", *flags]) == 0
    table = capsys.readouterr().out
    assert MODEL in table and f"{from_micro(micro(c['cost_rub'] for c in charges)):.6f}" in table


def test_a_hive_dataset_on_s3_reads_with_its_partition_keys(tmp_path, s3):
    client, flags = s3
    table = pa.table({"id": ["a", "b", "c"], "text": pa.array(["x", "y", "z"], pa.large_string()),
                      "lang": ["en", "ru", "en"]})
    ds.write_dataset(table, tmp_path / "ds", format="parquet", partitioning=["lang"], partitioning_flavor="hive")
    (tmp_path / "ds" / "_SUCCESS").write_bytes(b"")
    for path in sorted(p for p in (tmp_path / "ds").rglob("*") if p.is_file()):
        upload(client, path, f"ds/{path.relative_to(tmp_path / 'ds').as_posix()}")
    opts = PipelineOptions(flags)
    use_filesystems(opts)
    info = inspect_input(f"s3://{BUCKET}/ds", "id", "text", ["lang"])
    assert len(info.files) == 2 and all(f.startswith(f"s3://{BUCKET}/ds/lang=") for f in info.files)
    with beam.Pipeline(runner="FnApiRunner", options=opts) as p:
        rows = (p | ReadParquetTables(info.files, ["id", "text", "lang"], info.partition_mappings)
                | beam.FlatMap(lambda t: [tuple(r.values()) for r in t.to_pylist()]))
        assert_that(rows, equal_to([("a", "x", "en"), ("b", "y", "ru"), ("c", "z", "en")]))


def test_an_unwritable_s3_output_is_one_clear_error(tmp_path, s3, sandbox, monkeypatch, caplog):
    client, flags = s3
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    corpus = upload(client, write_corpus(tmp_path / "c.parquet", corpus_rows(n_short=3, n_long=0)), "in/c.parquet")
    code = main(["run", "--input", corpus, "--output", "s3://no-such-bucket/out", "--model", MODEL,
                 "--base-url", sandbox.base_url, *flags])
    assert code == 2
    assert "--output s3://no-such-bucket/out: not writable" in caplog.text
    assert not ledger(sandbox)

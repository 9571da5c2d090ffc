"""Object stores for real, each on loopback with Beam's own filesystem for it. Every path of
the job is on the store: the corpus, the model catalogue, the output, the resume, --known and
the report.

- s3://: moto's S3 server, reached with Beam's options (--s3_endpoint_url, --s3_region_name)
  and the keys from the environment, as boto3 reads them. boto3 (the `aws` extra), moto and
  flask are in the `test` extra.
- gs://: gcp-storage-emulator, reached by google-cloud-storage through STORAGE_EMULATOR_HOST
  with --no_auth. Beam's GCP extra is ~440 MB, so it is its own extra (`gcs-test`); without
  it these cases are skipped.
"""
from __future__ import annotations

import logging
from pathlib import Path

import apache_beam as beam
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.testing.util import assert_that, equal_to

from pipeline.checks.inputs import inspect_input
from pipeline.cli import main
from pipeline.settings.options import use_filesystems
from tests.conftest import free_port
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, ledger, micro,
                                     start_sandbox, write_corpus, write_models)
from transforms.money.apportion import from_micro
from transforms.read.parquet import ReadParquetTables

BUCKET = "corp"


class S3:
    """A fresh bucket on moto's S3 server on loopback; Beam reaches it through its S3 options."""
    scheme = "s3"

    def __init__(self, monkeypatch):
        boto3 = pytest.importorskip("boto3")
        server_module = pytest.importorskip("moto.moto_server.threaded_moto_server")
        for name, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                            ("AWS_CONFIG_FILE", "/dev/null"), ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")):
            monkeypatch.setenv(name, value)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 call otherwise
        self._server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self.client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1")
        self.client.create_bucket(Bucket=BUCKET)
        # moto keeps its buckets in the process, across servers: empty what an earlier test left
        for key in self.keys(""):
            self.client.delete_object(Bucket=BUCKET, Key=key)
        self.flags = ["--s3_endpoint_url", f"http://{host}:{port}", "--s3_region_name", "us-east-1"]

    def put(self, local: Path, key: str) -> str:
        self.client.upload_file(str(local), BUCKET, key)
        return f"s3://{BUCKET}/{key}"

    def keys(self, prefix: str) -> list[str]:
        pages = self.client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
        return [obj["Key"] for page in pages for obj in page.get("Contents", [])]

    def get(self, key: str, local: Path) -> None:
        self.client.download_file(BUCKET, key, str(local))

    def stop(self) -> None:
        self._server.stop()


class GCS:
    """A fresh bucket on gcp-storage-emulator on loopback; Beam's GCS client (google-cloud-storage)
    reaches it through STORAGE_EMULATOR_HOST, anonymously (--no_auth). Needs the `gcs-test` extra."""
    scheme = "gs"

    def __init__(self, monkeypatch):
        pytest.importorskip("google.cloud.storage")
        emulator = pytest.importorskip("gcp_storage_emulator.server")
        logging.getLogger("gcp_storage_emulator").setLevel(logging.ERROR)
        port = free_port()
        self._server = emulator.create_server("127.0.0.1", port, in_memory=True, default_bucket=BUCKET)
        self._server.start()
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
        from google.cloud import storage
        self.bucket = storage.Client.create_anonymous_client().bucket(BUCKET)
        self.flags = ["--no_auth", "--project", "local"]

    def put(self, local: Path, key: str) -> str:
        self.bucket.blob(key).upload_from_filename(str(local))
        return f"gs://{BUCKET}/{key}"

    def keys(self, prefix: str) -> list[str]:
        return [blob.name for blob in self.bucket.client.list_blobs(self.bucket, prefix=prefix)]

    def get(self, key: str, local: Path) -> None:
        self.bucket.blob(key).download_to_filename(str(local))

    def stop(self) -> None:
        self._server.stop()


@pytest.fixture(params=[pytest.param(S3, marks=pytest.mark.soak), GCS], ids=["s3", "gs"])   # s3 in make test: test_input_changes
def store(request, monkeypatch):
    started = request.param(monkeypatch)
    yield started
    started.stop()


def mirror(store, prefix: str, into: Path) -> Path:
    """Every object under PREFIX, downloaded to INTO (to check with the local helpers)."""
    for key in store.keys(prefix):
        target = into / key[len(prefix):]
        target.parent.mkdir(parents=True, exist_ok=True)
        store.get(key, target)
    return into


def test_run_resume_known_and_report_on_an_object_store(tmp_path, store, sandbox_factory, monkeypatch, capsys):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    rows = corpus_rows(n_short=60, n_long=2)
    for i, part in enumerate((rows[::2], rows[1::2])):
        store.put(write_corpus(tmp_path / f"part-{i}.parquet", part), f"in/part-{i}.parquet")
    models = write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    root = f"{store.scheme}://{BUCKET}"

    def run(output: str, *extra: str) -> int:
        return main(["run", "--output", output, "--model", MODEL, "--base-url", sb.base_url,
                     "--models-config", store.put(models, "conf/models.yaml"), *store.flags, *extra])

    corpus = f"{root}/in/*.parquet"
    assert run(f"{root}/out", "--input", corpus, "--max-spend-rub", "0.2", "--allow-partial") == 4
    partial = len(ledger(sb))
    assert partial > 0
    assert run(f"{root}/out", "--resume") == 0           # the pending rows, without the corpus
    assert run(f"{root}/out", "--resume", "--input", corpus) == 0  # nothing left to pay
    charges = ledger(sb)
    assert len(charges) > partial and not billed_twice(charges)
    out = mirror(store, "out/", tmp_path / "out")
    assert assert_every_row_once(out, rows)["pending"] == 0
    assert not any(out.glob("_journal/*/*"))

    # an object store has no `current/` link: every vector DIR's history holds is fine to reuse
    assert run(f"{root}/again", "--input", corpus, "--known", f"{root}/out/history/*/embeddings-*.parquet") == 0
    assert len(ledger(sb)) == len(charges)  # every vector reused, nothing paid
    assert assert_every_row_once(mirror(store, "again/", tmp_path / "again"), rows)["embeddings"] > 0

    capsys.readouterr()
    assert main(["report", f"{root}/out", *store.flags]) == 0
    table = capsys.readouterr().out
    assert MODEL in table and f"{from_micro(micro(c['cost_rub'] for c in charges)):.6f}" in table


def test_a_hive_dataset_on_an_object_store_reads_with_its_partition_keys(tmp_path, store):
    table = pa.table({"id": ["a", "b", "c"], "text": pa.array(["x", "y", "z"], pa.large_string()),
                      "lang": ["en", "ru", "en"]})
    ds.write_dataset(table, tmp_path / "ds", format="parquet", partitioning=["lang"], partitioning_flavor="hive")
    (tmp_path / "ds" / "_SUCCESS").write_bytes(b"")
    for path in sorted(p for p in (tmp_path / "ds").rglob("*") if p.is_file()):
        store.put(path, f"ds/{path.relative_to(tmp_path / 'ds').as_posix()}")
    opts = PipelineOptions(store.flags)
    use_filesystems(opts)
    root = f"{store.scheme}://{BUCKET}/ds"
    info = inspect_input(root, "id", "text", ["lang"])
    assert len(info.files) == 2 and all(f.startswith(f"{root}/lang=") for f in info.files)
    with beam.Pipeline(runner="FnApiRunner", options=opts) as p:
        rows = (p | ReadParquetTables(info.files, ["id", "text", "lang"], info.partition_mappings)
                | beam.FlatMap(lambda t: [tuple(r.values()) for r in t.to_pylist()]))
        assert_that(rows, equal_to([("a", "x", "en"), ("b", "y", "ru"), ("c", "z", "en")]))


def test_an_unwritable_output_is_one_clear_error(tmp_path, store, sandbox, monkeypatch, caplog):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-test-key")
    corpus = store.put(write_corpus(tmp_path / "c.parquet", corpus_rows(n_short=3, n_long=0)), "in/c.parquet")
    output = f"{store.scheme}://no-such-bucket/out"
    code = main(["run", "--input", corpus, "--output", output, "--model", MODEL,
                 "--base-url", sandbox.base_url, *store.flags])
    assert code == 2
    assert f"--output {output}: not writable" in caplog.text
    assert not ledger(sandbox)

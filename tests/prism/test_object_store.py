"""s3:// on Prism's worker pool: the workers reach the store with the job's options, as the local
runner's do. A pool's workers are processes of their own: Beam's FileSystems in them has only
the options their harness was started with (tools/worker_boot.py boots them as the SDK
container's pool does)."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from tests.e2e.helpers import corpus_rows, write_corpus
from tests.e2e.test_object_stores import S3
from tests.prism.twin import Side, env_for

MODEL = "text-embedding-3-small"


@pytest.fixture
def s3(monkeypatch):
    store = S3(monkeypatch)
    yield store
    store.stop()


def _view(s3, tmp_path, prefix: str) -> list[tuple]:
    s3.get(f"{prefix}/summary.json", tmp_path / "summary.json")
    rows = []
    for i, f in enumerate(json.loads((tmp_path / "summary.json").read_text())["files"]):
        if f.rsplit("/", 1)[1].startswith("embeddings-"):
            s3.get(f"{prefix}/{f}", tmp_path / f"{i}.parquet")
            rows += [(r["doc_id"], r["chunk_index"], r["text_sha256"], bytes(memoryview(pq.read_table(
                tmp_path / f"{i}.parquet").column("embedding")[j].values.to_numpy(zero_copy_only=False))))
                for j, r in enumerate(pq.read_table(tmp_path / f"{i}.parquet").to_pylist())]
    return sorted(rows)


def test_s3_on_a_worker_pool(tmp_path, s3, sandbox_factory, leak_key, own_pool, prism_binary):
    corpus = s3.put(write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "in/corpus.parquet")
    env = env_for(leak_key)   # the store's keys (S3 set them) with the API key, for the launcher and the pool
    pool = own_pool(env)
    views = {}
    for name, flags in (("local", []), ("prism-pool", ["--profile", "prism-pool", "--prism_location", prism_binary,
                                                       "--environment_config", pool.address])):
        side = Side(name, tmp_path / name, sandbox_factory(key=leak_key, balance=1000.0), flags + s3.flags,
                    pool.launcher_env(env), pool.logs, leak_key)
        outcome = side.cli("run", "--input", corpus, "--output", f"s3://corp/{name}", "--model", MODEL,
                           "--base-url", "{base_url}")
        assert outcome.code == 0, outcome.raw_stderr[-3000:]
        (tmp_path / f"view-{name}").mkdir()
        views[name] = _view(s3, tmp_path / f"view-{name}", name)
    assert views["prism-pool"] == views["local"] and len(views["local"]) > 20

"""EmbedTexts with a store of paid texts, against the sandbox's ledger (what was billed): a
rerun, a rerun after a pipeline that failed once its requests were paid, a day-2 run on a
changed source, a store on s3:// (moto), two pipelines on one store at once, and a CLI output
DIR read as a store."""
from __future__ import annotations

import collections
import hashlib
import os
import subprocess
import sys
import textwrap
import threading

import apache_beam as beam
import numpy as np
import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions

import embedpipe
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows, run, write_corpus
from tests.e2e.test_object_stores import S3
from tests.library.helpers import MODEL, collected, micro, models_config, run_pipeline
from tests.side_venv import REPO
from transforms.dedupe.compaction import compact
from transforms.dedupe.store import SCOPE, PaidStore, StoreSpec
from transforms.worker import runscoped

KINDS = ("embeddings", "failed", "pending", "requests")


@pytest.fixture(autouse=True)
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def _docs(n: int, day: int = 1, changed: int = 0) -> list[dict]:
    """N documents; on day 2 the first CHANGED of them have new text."""
    return [{"id": f"d{i}", "text": f"document {i} of day {day if i < changed else 1}: " + "words " * (20 + i % 7)}
            for i in range(n)]


def _small_requests(tmp_path) -> str:
    """A catalogue whose model takes 4 inputs a request: many requests from a few documents."""
    return models_config(tmp_path, max_inputs_per_request=4)


def _run(where, rows, sandbox, *argv, fail_once: str | None = None, **kwargs) -> dict:
    """One pipeline in this process, as a new process would start it (no store index held from
    an earlier one); FAIL_ONCE: a flag file whose absence makes a step after Embed raise once."""
    runscoped.discard(SCOPE)
    where.mkdir(parents=True, exist_ok=True)

    def build(p):
        result = p | beam.Create(rows, reshuffle=False) | embedpipe.EmbedTexts(MODEL, sandbox.base_url, **kwargs)
        if fail_once:
            result.embeddings | "FailOnce" >> beam.Map(_fail_once, fail_once)
        return {kind: getattr(result, kind) for kind in KINDS}
    run_pipeline(build, where, *argv)
    return collected(where, *KINDS)


def _fail_once(row, flag: str):
    if not os.path.exists(flag):
        open(flag, "w").close()
        raise RuntimeError("a user's step fails once")
    return row


def _paid(sandbox) -> collections.Counter:
    return collections.Counter(sha for c in sandbox.ledger() for sha in c["input_sha256"])


def _rows(out) -> dict:
    return {(r["doc_id"], r["chunk_index"]): (r["text_sha256"], r["embedding"].tobytes()) for r in out["embeddings"]}


def test_a_rerun_with_a_store_sends_nothing_and_gives_the_same_rows(sandbox, tmp_path):
    rows = corpus_rows()
    store = str(tmp_path / "store")
    first = _run(tmp_path / "1", rows, sandbox, store=store)
    charges = sandbox.ledger()
    assert charges and max(_paid(sandbox).values()) == 1
    again = _run(tmp_path / "2", rows, sandbox, store=store)
    assert sandbox.ledger() == charges and again["requests"] == []
    assert _rows(again) == _rows(first)
    assert all(r["cost_rub"] == 0 for r in again["embeddings"])
    assert {r["request_id"] for r in again["embeddings"]} <= {c["request_id"] for c in charges}
    assert sorted(map(repr, again["failed"])) == sorted(map(repr, first["failed"]))


def test_a_pipeline_that_failed_after_paying_pays_nothing_twice_when_run_again(sandbox, tmp_path):
    """The FnApiRunner does not retry a bundle (a failure fails the pipeline): running the same
    pipeline again is what a retried bundle does, with the store between the two."""
    models = _small_requests(tmp_path)   # many requests, some paid before the failure
    rows, store, flag = _docs(120), str(tmp_path / "store"), str(tmp_path / "failed-once")
    with pytest.raises(Exception, match="fails once"):
        _run(tmp_path / "1", rows, sandbox, store=store, models_config=models, fail_once=flag)
    paid_first = _paid(sandbox)
    assert paid_first
    out = _run(tmp_path / "2", rows, sandbox, store=store, models_config=models, fail_once=flag)
    paid = _paid(sandbox)
    assert max(paid.values()) == 1                       # 0 texts paid twice
    assert sorted(r["doc_id"] for r in out["embeddings"]) == sorted(r["id"] for r in rows)
    reused = [r for r in out["embeddings"] if r["text_sha256"] in paid_first]
    assert reused and all(r["cost_rub"] == 0 for r in reused)
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == sum(micro(r["cost_rub"]) for r in out["requests"])


def test_a_day_2_run_pays_only_the_changed_texts(sandbox, tmp_path):
    store = str(tmp_path / "store")
    _run(tmp_path / "1", _docs(200), sandbox, store=store)
    day1 = _paid(sandbox)
    day2_rows = _docs(200, day=2, changed=5)
    out = _run(tmp_path / "2", day2_rows, sandbox, store=store)
    day2 = _paid(sandbox) - day1
    changed = {hashlib.sha256(r["text"].encode()).hexdigest() for r in day2_rows[:5]}
    assert set(day2) == changed and max(day2.values()) == 1
    assert len(out["embeddings"]) == 200 and len(out["requests"]) == 1
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == sum(micro(r["cost_rub"]) for r in out["requests"])


def test_a_store_on_s3_and_its_compaction(sandbox, tmp_path, monkeypatch):
    s3 = S3(monkeypatch)
    try:
        rows, store = _docs(60), "s3://corp/store"
        _run(tmp_path / "1", rows, sandbox, *s3.flags, store=store)
        charges = sandbox.ledger()
        assert charges and any(k.startswith("store/_journal/") for k in s3.keys("store/"))
        done = embedpipe.compact_store(store, PipelineOptions(s3.flags))
        assert done.entries == len(charges) and done.texts == 60
        assert not [k for k in s3.keys("store/_journal/") if k.endswith(".parquet")]
        out = _run(tmp_path / "2", rows, sandbox, *s3.flags, store=store)
        assert sandbox.ledger() == charges and len(out["embeddings"]) == 60
    finally:
        s3.stop()


def test_a_run_config_on_an_object_store_is_read(sandbox, tmp_path, monkeypatch):
    s3 = S3(monkeypatch)
    try:
        settings = tmp_path / "pipeline.yaml"
        settings.write_text(yaml.safe_dump({"pack": {"fill_target": 0.5}}))
        out = _run(tmp_path, _docs(3), sandbox, *s3.flags, run_config=s3.put(settings, "conf/pipeline.yaml"))
        assert len(out["embeddings"]) == 3
    finally:
        s3.stop()


PIPELINE = textwrap.dedent("""
    import sys
    import apache_beam as beam
    import embedpipe
    base_url, store, n, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    rows = [{"id": f"d{i}", "text": f"document {i} of day 1: " + "words " * (20 + i % 7)} for i in range(n)]
    with beam.Pipeline() as p:
        p | beam.Create(rows) | embedpipe.EmbedTexts("text-embedding-3-small", base_url, store=store,
                                                     models_config=models)
""")


@pytest.mark.soak   # slow: make soak
def test_two_pipelines_on_one_store_at_once_with_compaction_beside_them(sandbox, tmp_path):
    """Each pays a text at most once, so together at most twice; the store stays whole."""
    store, n, models = str(tmp_path / "store"), 400, _small_requests(tmp_path)
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    procs = [subprocess.Popen([sys.executable, "-c", PIPELINE, sandbox.base_url, store, str(n), models], cwd=REPO,
                              env=env, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    compactions = []
    stop = threading.Event()

    def compacting():
        while not stop.is_set():
            compactions.append(compact(store))
            stop.wait(0.2)
    thread = threading.Thread(target=compacting)
    thread.start()
    try:
        for proc in procs:
            assert proc.wait(timeout=300) == 0, proc.stderr.read()[-3000:]
    finally:
        stop.set()
        thread.join()
    paid = _paid(sandbox)
    assert len(paid) == n and max(paid.values()) <= 2
    held = PaidStore(StoreSpec(store), MODEL, 1536)
    shas = [hashlib.sha256(r["text"].encode()).hexdigest() for r in _docs(n)]
    found = held.lookup(shas)
    assert set(found) == set(shas) and all(np.isfinite(f.vector).all() for f in found.values())
    assert any(c.entries for c in compactions)
    charges = len(sandbox.ledger())
    _run(tmp_path / "3", _docs(n), sandbox, store=store, models_config=models)
    assert len(sandbox.ledger()) == charges


def test_a_cli_output_dir_is_read_as_a_store(sandbox, tmp_path):
    rows = [r for r in corpus_rows() if r["id"] != "twice"]
    assert run("--input", str(write_corpus(tmp_path / "in.parquet", rows)), "--output", str(tmp_path / "out"),
               "--model", MODEL, "--base-url", sandbox.base_url) == 0
    charges = sandbox.ledger()
    with pytest.raises(Exception, match="read_stores="):
        _run(tmp_path / "x", rows, sandbox, store=str(tmp_path / "out"))
    out = _run(tmp_path / "lib", rows, sandbox, store=str(tmp_path / "store"), read_stores=[str(tmp_path / "out")])
    assert sandbox.ledger() == charges and out["requests"] == []
    embedded = {r["doc_id"] for r in out["embeddings"]}
    assert "long-1" in embedded and embedded == {r["id"] for r in rows if r["id"] and (r["text"] or "").strip()}

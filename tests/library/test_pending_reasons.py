"""The library words and counts a text that is not embedded by the table of pending reasons
(transforms/pending.py), against the sandbox over HTTP in a real pipeline."""
from __future__ import annotations

import apache_beam as beam
import pytest
import yaml
from apache_beam.ml.rag.types import Chunk, Content
from apache_beam.ml.transforms.base import MLTransform

import embedpipe
from embedpipe.rag import ERROR
from tests.conftest import SANDBOX_KEY
from tests.library.helpers import MODEL, collected, run_pipeline
from transforms.pending import Pending


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def test_a_text_whose_request_timed_out_is_pending_not_failed_and_not_called_unsent(sandbox_factory, key_env,
                                                                                  tmp_path):
    """1.5 s a request, read timeouts of 0.3 s: the request is sent twice, both attempts may be
    billed, and the run stops sending. Its texts were counted as failed and described as "not
    sent"; they are pending (timed_out), as the CLI's rows are."""
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--latency-ms", "1500"])
    settings = tmp_path / "pipeline.yaml"
    settings.write_text(yaml.safe_dump({"client": {"read_timeout_s": 0.3, "read_timeout_max_s": 0.3,
                                                   "initial_backoff_s": 0.01},
                                        "embed": {"max_in_flight": 1, "initial_in_flight": 1}}))
    items = [Chunk(content=Content(text=f"a text the service is too slow for, number {i}"), id=f"c{i}")
             for i in range(3)]

    def build(p):
        embedder = embedpipe.ServiceTextEmbeddings(model=MODEL, base_url=sb.base_url, run_config=str(settings))
        return {"out": p | beam.Create(items, reshuffle=False)
                | MLTransform(write_artifact_location=str(tmp_path / "a")).with_transform(embedder)}

    result = run_pipeline(build, tmp_path)
    out = collected(tmp_path, "out")["out"]
    found = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("embedpipe"))["counters"]
    counters = {c.key.metric.name: c.committed for c in found}
    assert len(out) == 3 and all(c.embedding is None for c in out)
    assert {c.metadata[ERROR] for c in out} == {Pending.TIMED_OUT}
    assert counters["pending_texts"] == 3 and counters["failed_texts"] == 0
    details = {c.metadata[f"{ERROR}_detail"] for c in out}
    assert not any(d.startswith("not sent") for d in details) and all("may have been billed" in d for d in details)

"""The API key on Prism: in no Prism log (at debug), no job option and no part of the pipeline
Prism was given (its proto, with every pickled DoFn, coder and window fn unpacked), no worker
pool's log, no output. Prism here is a job service of its own, whose jobs can be read back
after they ran; the workers get the key from the launcher (LOOPBACK: its threads; a pool of this
checkout: with the job's admission, tests/prism/test_strangers.py), or from a file at a path they
read."""
from __future__ import annotations

import pytest

from tests.e2e.helpers import corpus_rows, write_corpus
from tests.e2e.test_secrets import hits, unpacked_pickles
from tests.prism.twin import Side, env_for

MODEL = "text-embedding-3-small"


def _job_blobs(job_service) -> dict[str, bytes]:
    blobs = {}
    for info, pipeline in job_service.jobs():
        proto = pipeline.SerializeToString()
        blobs[f"{info.job_id} pipeline"] = proto
        blobs[f"{info.job_id} options"] = info.pipeline_options.SerializeToString()
        blobs.update({f"{info.job_id} pickle {i}": p for i, p in enumerate(unpacked_pickles(proto))})
    return blobs


@pytest.mark.parametrize("workers, source", [("LOOPBACK", "env"), ("EXTERNAL", "env"), ("EXTERNAL", "file")])
def test_the_key_is_in_no_prism_log_job_option_or_pipeline(tmp_path, sandbox_factory, leak_key, job_service,
                                                            own_pool, workers, source):
    env, flags = env_for(leak_key), ["--profile", "prism", "--job_endpoint", job_service.endpoint]
    if source == "file":   # on a path the launcher and the workers read; in neither's environment
        (key_file := tmp_path / "key").write_text(leak_key)
        env.pop("EMBEDDINGS_API_KEY")
        flags += ["--api-key-file", str(key_file)]
    pool = None
    if workers == "EXTERNAL":
        pool = own_pool(env)
        env = pool.launcher_env(env)
        flags += ["--environment_type", "EXTERNAL", "--environment_config", pool.address]
    scanned = lambda: {str(job_service.log): job_service.log.read_bytes(), **(pool.logs() if pool else {})}
    side = Side("prism", tmp_path / "side", sandbox_factory(key=leak_key, balance=1000.0), flags, env, scanned, leak_key)
    outcome = side.cli("run", "--input", write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "--output",
                       "{out}", "--model", MODEL, "--base-url", "{base_url}")
    assert outcome.code == 0, outcome.raw_stderr[-2000:]
    blobs = _job_blobs(job_service)
    assert not hits(leak_key, blobs), hits(leak_key, blobs)
    # the scan reads inside the job: the DoFns carry where the key is, never the key
    assert any(b"KeySource" in blob for name, blob in blobs.items() if " pickle " in name)
    assert source != "file" or any(str(key_file).encode() in blob for name, blob in blobs.items() if "pickle" in name)

"""summary.json's `runner`: which runner a run used, how its workers ran, and the addresses it
used (Prism's, a job service's, a worker pool's), never an environment's command or a secret."""
from __future__ import annotations

import json

from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import prism
from pipeline.runner import described


def test_the_local_runner_with_its_workers():
    assert described(PipelineOptions([])) == {"name": "DirectRunner", "runs_as": "FnApiRunner",
                                               "running_mode": "in_memory", "workers": 1}
    threads = PipelineOptions(["--direct_running_mode", "multi_threading", "--direct_num_workers", "3"])
    assert described(threads)["workers"] == 3


def test_prism_started_by_the_launcher_its_address_and_the_pool(monkeypatch):
    monkeypatch.setattr(prism._JobServer, "started", "localhost:40123")
    pool = PipelineOptions(["--runner", "PrismRunner", "--environment_type", "EXTERNAL",
                            "--environment_config", "localhost:50000"])
    assert described(pool) == {"name": "PrismRunner", "environment_type": "EXTERNAL", "prism": "localhost:40123",
                               "worker_pool": "localhost:50000"}
    own = PipelineOptions(["--runner", "PrismRunner", "--job_endpoint", "user:secret@prism.internal:8073"])
    assert described(own)["prism"] == "prism.internal:8073"   # a job service of its own; no credentials


def test_a_process_environment_is_not_written():
    config = json.dumps({"command": "/opt/boot", "env": {"EMBEDDINGS_API_KEY": "sk-live"}})
    found = described(PipelineOptions(["--runner", "PortableRunner", "--job_endpoint", "localhost:8099",
                                       "--environment_type", "PROCESS", "--environment_config", config]))
    assert found == {"name": "PortableRunner", "environment_type": "PROCESS", "job_endpoint": "localhost:8099"}
    assert "sk-live" not in json.dumps(found)

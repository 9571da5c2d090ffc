"""Whose a worker pool is and which workers it starts (pipeline/workerpool.py), without a pool:
admissions taken by the request of their job only, once, and only while their launcher lives and
only from files no one else could write; a record without a start time is no pool's; a launcher's
check of the pool its EXTERNAL workers name. The pools themselves: tests/prism/test_pool.py and
test_strangers.py."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
from apache_beam.options.pipeline_options import PortableOptions
from apache_beam.portability.api import beam_fn_api_pb2, endpoints_pb2

from pipeline import workerpool
from pipeline.exits import UsageError
from service.credentials import ENV_VAR

PRISM = "127.0.0.1:41234"   # as Prism names itself to its workers


def request(worker_id: str = "job-001[job]_env", prism: str = PRISM, provision: str | None = None):
    at = lambda address: endpoints_pb2.ApiServiceDescriptor(url=address)
    return beam_fn_api_pb2.StartWorkerRequest(worker_id=worker_id, control_endpoint=at(prism),
                                              logging_endpoint=at(prism), artifact_endpoint=at(prism),
                                              provision_endpoint=at(provision or prism))


def test_a_request_matches_the_job_of_the_prism_that_was_admitted():
    assert workerpool.matches(request(), PRISM, "job-001")
    assert not workerpool.matches(request("job-0011[job]_env"), PRISM, "job-001")   # job-0011 is another job
    assert not workerpool.matches(request(prism="127.0.0.1:41235"), PRISM, "job-001")
    assert not workerpool.matches(request(provision="127.0.0.1:41235"), PRISM, "job-001")   # its options from elsewhere
    # the same port by name: localhost may reach another listener on ::1
    assert not workerpool.matches(request(prism="localhost:41234"), PRISM, "job-001")


def test_an_admission_is_taken_once_with_its_key(tmp_path):
    path = workerpool.admit(tmp_path, PRISM, "job-001", "sk-launcher")
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert workerpool.take(tmp_path, request("job-002[job]_env")) is None and path.exists()
    assert workerpool.take(tmp_path, request()) == {ENV_VAR: "sk-launcher"}
    assert workerpool.take(tmp_path, request()) is None and not path.exists()
    workerpool.admit(tmp_path, PRISM, "job-003", None)   # a launcher whose workers read a key file
    assert workerpool.take(tmp_path, request("job-003[job]_env")) == {}


def test_an_admission_of_a_launcher_gone_is_deleted_unused(tmp_path):
    """By the pool's next request, or the next launcher's admission: it holds the key."""
    gone = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True).stdout)

    def of_a_launcher_gone():
        path = workerpool.admit(tmp_path, PRISM, "job-001", "sk-launcher")
        path.write_text(json.dumps({**json.loads(path.read_text()), "launcher": gone}))
        return path

    path = of_a_launcher_gone()
    assert workerpool.take(tmp_path, request()) is None and not path.exists()
    path = of_a_launcher_gone()
    assert workerpool.admit(tmp_path, PRISM, "job-002", None).exists() and not path.exists()


@pytest.mark.parametrize("opened", ["file", "directory"])
def test_an_admission_others_could_have_written_is_none(tmp_path, opened):
    path = workerpool.admit(tmp_path, PRISM, "job-001", "sk-launcher")
    (path if opened == "file" else path.parent).chmod(0o666 if opened == "file" else 0o777)
    assert workerpool.take(tmp_path, request()) is None


def test_a_record_without_its_start_time_is_no_pool(tmp_path):
    (tmp_path / "pids.json").write_text(json.dumps({"worker_pools": [os.getpid()]}))   # as recorded before
    assert workerpool.recorded(tmp_path) == {os.getpid(): None} and workerpool.running(tmp_path) == {}
    assert workerpool.port_of(os.getpid(), tmp_path, workerpool.started(os.getpid())) is None   # no pool's command


def test_addresses():
    assert workerpool.address("0.0.0.0", 5) == "localhost:5" and workerpool.address("::1", 5) == "[::1]:5"
    assert workerpool.split_address("[::1]:5") == ("[::1]", 5) and workerpool.split_address("host") == ("", None)


def _external(config: str) -> PortableOptions:
    return PortableOptions(["--environment_type", "EXTERNAL", "--environment_config", config])


def test_a_launcher_takes_only_this_checkouts_pool_on_this_machine(tmp_path, monkeypatch):
    monkeypatch.setenv(workerpool.STATE_VAR, str(tmp_path))
    assert workerpool.own_pool(PortableOptions(["--environment_type", "LOOPBACK"])) is None
    assert workerpool.own_pool(_external("pool.example.internal:50000")) is None   # its owner's
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        with pytest.raises(UsageError, match=f"no worker pool runs on port {port}: start this checkout's with "
                                             f"`POOL_PORT={port} make pool-up`"):
            workerpool.own_pool(_external(f"localhost:{port}"))
        taken.listen()
        with pytest.raises(UsageError, match=f"the worker pool on port {port} is not this checkout's"):
            workerpool.own_pool(_external(f"localhost:{port}"))

"""What someone other than the launcher reaches of a run on Prism: the worker pool and the
launcher's worker service listen on loopback only; a StartWorker request that is not for a job
the launcher started runs nothing, in the pool or in the launcher; the pool holds no API key, and
the worker of a job gets its launcher's key; a launcher refuses, before anything is read or sent,
a pool on this machine that is another checkout's. The stranger here sends its requests from this
process over loopback, its endpoints a runner's provision service of its own."""
from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
from concurrent import futures

import grpc
import psutil
import pytest
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import (beam_fn_api_pb2, beam_fn_api_pb2_grpc, beam_provision_api_pb2_grpc,
                                         endpoints_pb2)

from pipeline import prism, workerpool
from pipeline.exits import UsageError
from service.credentials import ENV_VAR, key_fingerprint
from tests.conftest import free_port
from tests.e2e.helpers import corpus_rows, write_corpus
from tests.prism.test_faults import Job
from tests.prism.twin import Side, env_for
from tests.second_user import second_user
from tools import pool as pools

MODEL = "text-embedding-3-small"


class Runner(beam_provision_api_pb2_grpc.ProvisionServiceServicer):
    """The endpoints a StartWorker request names: a runner's provision service that notes each
    worker asking for its job's options, and holds it there until stopped."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.called, self._release = threading.Event(), threading.Event()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        beam_provision_api_pb2_grpc.add_ProvisionServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.address = f"127.0.0.1:{self.port}"   # as a Prism of make prism names itself
        self.server.start()

    def GetProvisionInfo(self, request, context):
        self.asked.append(dict(context.invocation_metadata()).get("worker_id", ""))
        self.called.set()
        self._release.wait(60)
        context.abort(grpc.StatusCode.UNAVAILABLE, "no job here")

    def stop(self) -> None:
        self._release.set()
        self.server.stop(0)


@pytest.fixture
def runner():
    r = Runner()
    yield r
    r.stop()


def start_worker(address: str, runner: str, worker_id: str) -> beam_fn_api_pb2.StartWorkerResponse:
    endpoint = endpoints_pb2.ApiServiceDescriptor(url=runner)
    with grpc.insecure_channel(address) as channel:
        return beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolStub(channel).StartWorker(
            beam_fn_api_pb2.StartWorkerRequest(worker_id=worker_id, control_endpoint=endpoint,
                                               logging_endpoint=endpoint, provision_endpoint=endpoint,
                                               artifact_endpoint=endpoint), timeout=30)


def listening_on(pid: int) -> set[str]:
    """The local addresses PID listens on (an IPv4 address mapped into IPv6 as IPv4)."""
    found = set()
    for c in psutil.Process(pid).net_connections("inet"):
        if c.status == psutil.CONN_LISTEN:
            ip = ipaddress.ip_address(c.laddr.ip.split("%")[0])
            found.add(str(getattr(ip, "ipv4_mapped", None) or ip))
    return found


def loopback(addresses: set[str]) -> bool:
    return bool(addresses) and all(ipaddress.ip_address(a).is_loopback for a in addresses)


def test_the_pool_listens_on_loopback_unless_told_otherwise(own_pool, tmp_path):
    assert listening_on(own_pool().pid) == {"127.0.0.1", "::1"}
    state = tmp_path / "elsewhere"
    try:
        pid = pools.start(free_port(), state, host="127.0.0.2")   # POOL_HOST: that address, not every one
        assert listening_on(pid) == {"127.0.0.2"}
    finally:
        pools.down(state)


def test_a_pool_takes_both_loopback_addresses_or_none(tmp_path):
    """Another process on ::1 at the port would take the connections to localhost that try ::1
    first: the pool does not start rather than listen on 127.0.0.1 alone."""
    with socket.socket(socket.AF_INET6) as squatter:
        squatter.bind(("::1", 0))
        squatter.listen()
        try:
            with pytest.raises(SystemExit, match="did not start"):
                pools.start(squatter.getsockname()[1], tmp_path / ".pool")
        finally:
            pools.down(tmp_path / ".pool")


def test_a_stranger_s_request_starts_nothing_and_only_an_admitted_job_s_worker_has_the_key(own_pool, runner,
                                                                                          leak_key):
    pool = own_pool(env_for(leak_key))   # the key in the environment of `make pool-up`...
    assert ENV_VAR not in psutil.Process(pool.pid).environ()   # ...is not the pool's
    refused = start_worker(pool.address, runner.address, "job-001[job]_env")
    assert "refused" in refused.error and not psutil.Process(pool.pid).children()
    workerpool.admit(pool.state, runner.address, "job-001", key="sk-the-launchers")
    assert "refused" in start_worker(pool.address, runner.address, "job-002[job]_env").error   # another job there
    assert "refused" in start_worker(pool.address, f"127.0.0.1:{runner.port + 1}", "job-001[job]_env").error   # another Prism
    assert start_worker(pool.address, runner.address, "job-001[job]_env").error == ""
    assert runner.called.wait(60) and runner.asked == ["job-001[job]_env"]
    [worker] = psutil.Process(pool.pid).children()
    assert worker.environ()[ENV_VAR] == "sk-the-launchers"
    assert "refused" in start_worker(pool.address, runner.address, "job-001[job]_env").error   # admitted once


def test_a_launcher_s_admission_dies_with_it(own_pool, runner):
    """An admission whose launcher has gone (killed before its job started a worker) is refused
    and deleted: it holds the key."""
    pool = own_pool()
    path = workerpool.admit(pool.state, runner.address, "job-001", key="sk-x")
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path.write_text(json.dumps({**json.loads(path.read_text()), "launcher": int(gone.stdout)}))
    assert "refused" in start_worker(pool.address, runner.address, "job-001[job]_env").error
    assert not path.exists() and not runner.asked


def test_another_user_admits_no_job(own_pool, runner, tmp_path, monkeypatch):
    """An admission only counts when the pool's own user alone could have written it: a file of
    another user's, or a state directory other users write, is none."""
    user = second_user()
    pool = own_pool()
    path = workerpool.admit(pool.state, runner.address, "job-001", key=None)
    os.chown(path, user.pw_uid, user.pw_gid)   # as if that user had written it
    assert "refused" in start_worker(pool.address, runner.address, "job-001[job]_env").error and not runner.asked
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)   # as /tmp
    with pytest.raises(SystemExit, match="is not yours alone"):
        pools.start(free_port(), shared)
    monkeypatch.setenv(workerpool.STATE_VAR, str(pool.state))
    options = PipelineOptions(["--runner", "PrismRunner", "--environment_type", "EXTERNAL", "--environment_config",
                               pool.address])
    assert prism.own_pool(options) == pool.state
    for made_theirs in (lambda: pool.state.chmod(0o777), lambda: os.chown(pool.state, user.pw_uid, user.pw_gid)):
        made_theirs()
        with pytest.raises(UsageError, match="is not yours alone"):
            prism.own_pool(options)
    os.chown(pool.state, os.getuid(), os.getgid())   # the fixture stops it


def test_a_pool_directory_that_is_a_link_is_refused(tmp_path, monkeypatch):
    """The second user links the POOL_DIR root names in /tmp to a directory of root's: the pool and
    the launcher refuse it (the link could be turned, mid-run, to a directory of that user's)."""
    user = second_user()
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o1777)
    shared.chmod(0o1777)
    roots = tmp_path / "roots"
    roots.mkdir(mode=0o700)
    link = shared / "pool"
    link.symlink_to(roots)
    os.chown(link, user.pw_uid, user.pw_gid, follow_symlinks=False)
    try:
        with pytest.raises(SystemExit, match="is not yours alone"):
            pools.start(free_port(), link)
    finally:
        pools.down(link)   # one started there, if any
    monkeypatch.setenv(workerpool.STATE_VAR, str(link))
    with socket.socket() as listening:   # a pool there, whichever
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        with pytest.raises(UsageError, match="is not yours alone"):
            prism.own_pool(PipelineOptions(["--runner", "PrismRunner", "--environment_type", "EXTERNAL",
                                            "--environment_config", f"localhost:{listening.getsockname()[1]}"]))
    assert not list(roots.iterdir())


def test_a_launcher_refuses_another_checkout_s_pool_before_anything_is_sent(tmp_path, own_pool, sandbox_factory,
                                                                           leak_key, prism_binary):
    """B's pool on a port, A's launcher told to use it: refused in one line, before the balance is
    read; nothing charged."""
    theirs = own_pool()
    flags = ["--profile", "prism-pool", "--prism_location", prism_binary, "--environment_config", theirs.address]
    mine = env_for(leak_key, POOL_DIR=str(tmp_path / "mine"))
    side = Side("prism-pool", tmp_path / "side", sandbox_factory(key=leak_key, balance=1000.0), flags, mine,
                theirs.logs, leak_key)
    outcome = side.cli("run", "--input", write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "--output",
                       "{out}", "--model", MODEL, "--base-url", "{base_url}")
    assert outcome.code == 2 and "Traceback" not in outcome.raw_stderr, outcome.raw_stderr[-3000:]
    [line] = [line for line in outcome.raw_stderr.splitlines() if line.strip()]
    assert f"the worker pool on port {theirs.port} is not this checkout's" in line, line
    assert side.ledger() == [] and not (tmp_path / "side" / "out").exists()
    assert "starting worker" not in theirs.log.read_text()


def test_a_pool_at_another_address_of_this_machine_is_refused_unless_it_is_this_checkout_s(own_pool, monkeypatch):
    """127.0.0.0/8 is loopback whole, and 0.0.0.0 dials it: a stranger's pool at 127.0.0.2 on the
    port of this checkout's (which listens on localhost) is refused, as one on no address at all."""
    pool = own_pool()
    monkeypatch.setenv(workerpool.STATE_VAR, str(pool.state))

    def taken(config: str) -> object:
        return prism.own_pool(PipelineOptions(["--runner", "PrismRunner", "--environment_type", "EXTERNAL",
                                               "--environment_config", config]))

    for ours in (pool.address, f"127.0.0.1:{pool.port}", f"0.0.0.0:{pool.port}", f"[::ffff:127.0.0.1]:{pool.port}"):
        assert taken(ours) == pool.state, ours
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.2", pool.port))
        stranger.listen()
        with pytest.raises(UsageError, match=f"listens on localhost alone.*--environment_config localhost:{pool.port}"):
            taken(f"127.0.0.2:{pool.port}")
    with socket.socket() as stranger:
        stranger.bind(("127.0.0.2", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        with pytest.raises(UsageError, match=f"the worker pool on port {port} is not this checkout's"):
            taken(f"127.0.0.2:{port}")
    with pytest.raises(UsageError, match="no worker pool runs on port"):
        taken(f"127.0.0.3:{free_port()}")
    assert taken("pool.example.internal:50000") is None   # a pool elsewhere: its owner's (no lookup made)
    state, port = pool.state.parent / "v4", free_port()
    monkeypatch.setenv(workerpool.STATE_VAR, str(state))
    try:
        pools.start(port, state, host="127.0.0.1")   # POOL_HOST=127.0.0.1: ::1 at its port is anyone's
        with pytest.raises(UsageError, match=f"listens on 127.0.0.1 alone.*pass --environment_config 127.0.0.1:{port}"):
            taken(f"[::1]:{port}")
        assert taken(f"127.0.0.1:{port}") == state
    finally:
        pools.down(state)


def test_the_job_s_worker_pays_with_the_launcher_s_key_not_the_pool_s(tmp_path, own_pool, sandbox_factory,
                                                                      leak_key, prism_binary):
    pool = own_pool(env_for("sk-someone-elses-key"))   # started with another account's key
    flags = ["--profile", "prism-pool", "--prism_location", prism_binary, "--environment_config", pool.address]
    side = Side("prism-pool", tmp_path / "side", sandbox_factory(key=leak_key, balance=1000.0), flags,
                pool.launcher_env(env_for(leak_key)), pool.logs, leak_key)
    outcome = side.cli("run", "--input", write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "--output",
                       "{out}", "--model", MODEL, "--base-url", "{base_url}")
    assert outcome.code == 0, outcome.raw_stderr[-3000:]
    assert {c["key_id"] for c in side.ledger()} == {key_fingerprint(leak_key)}
    assert "starting worker" in pool.log.read_text() and not list((pool.state / "jobs").iterdir())


def test_the_launcher_s_worker_service_listens_on_loopback_and_refuses_strangers(tmp_path, sandbox_factory, leak_key,
                                                                                 prism_binary, runner):
    """A LOOPBACK run on Prism, looked at mid-run: the launcher listens on loopback only, and its
    worker service starts no worker for a stranger's request."""
    job = Job(tmp_path, sandbox_factory, leak_key, ["--profile", "prism", "--prism_location", prism_binary])
    proc = job.start()
    try:
        launcher = listening_on(proc.pid)
        assert loopback(launcher), launcher
        ports = {c.laddr.port for c in psutil.Process(proc.pid).net_connections("inet")
                 if c.status == psutil.CONN_LISTEN}
        for port in ports:
            assert "refused" in start_worker(f"localhost:{port}", runner.address, "job-001[job]_env").error
        assert not runner.asked
    finally:
        code = proc.wait(120)
    assert code == 0, job.log.read_text()[-3000:]

"""Fixtures of the Prism tests (`make prism-test`, marker `prism`): Prism's binary (built by
`make prism` when missing), a worker pool of the session on a free port, Prism's log captured
through a wrapper of its binary, and `both`, the pair of runners a test compares (twin.py).

Every test in this directory is marked `prism`: `make test` leaves them out."""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import uuid
from pathlib import Path

import grpc
import pytest
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc

from pipeline import workerpool
from tests.conftest import free_port
from tests.prism.twin import Pair, Side, env_for, wait_until
from tools import pool as pools
from tools import prism

HERE = Path(__file__).resolve().parent
VARIANTS = ("prism", "prism-pool")   # LOOPBACK workers (the launcher's), EXTERNAL ones (the pool's)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.prism)


@pytest.fixture(scope="session")
def prism_binary() -> str:
    return str(prism.install())


@pytest.fixture(scope="session")
def leak_key() -> str:
    """A key the scans recognise in any form (tests/e2e/test_secrets.py `needles`)."""
    return f"sk-LEAKCHECK-{uuid.uuid4().hex}"


class Pool:
    """A worker pool of tools/pool.py in a state directory of its own, which a launcher finds by
    `launcher_env`'s POOL_DIR."""

    def __init__(self, state: Path, env: dict[str, str]):
        self.state, self.env = state, env
        self.port = free_port()
        self.pid = pools.start(self.port, state, env)

    def launcher_env(self, env: dict[str, str]) -> dict[str, str]:
        return {**env, workerpool.STATE_VAR: str(self.state)}

    @property
    def address(self) -> str:
        return f"localhost:{self.port}"

    @property
    def log(self) -> Path:
        return self.state / f"worker_pool-{self.port}.log"

    def logs(self) -> dict[str, bytes]:
        return {str(p): p.read_bytes() for p in self.state.glob("*.log")}

    def alive(self) -> bool:
        return self.pid in workerpool.running(self.state)

    def follow(self, line: str, key: str) -> None:
        """The command in backquotes of a launcher's LINE, run as a user types it in the tree (the
        key for its `...`; the pool's state directory for .pool), from a shell whose environment
        has no key."""
        command = re.search(r"`([^`]+)`", line)
        assert command, line
        script = command.group(1).replace("EMBEDDINGS_API_KEY=...", f"EMBEDDINGS_API_KEY={shlex.quote(key)}")
        env = {k: v for k, v in self.env.items() if k != "EMBEDDINGS_API_KEY"}
        done = subprocess.run(["bash"], input=script, cwd=pools.ROOT, env={**env, "POOL_DIR": str(self.state)},
                              capture_output=True, text=True, timeout=180)   # stdin: the key in no argv
        assert done.returncode == 0, done.stdout + done.stderr
        self.pid = next(p for p, port in workerpool.running(self.state).items() if port == self.port)

    def stop(self) -> None:
        pools.down(self.state)


@pytest.fixture(scope="session")
def pool(tmp_path_factory, leak_key):
    started = Pool(tmp_path_factory.mktemp("pool"), env_for(leak_key))
    yield started
    started.stop()


@pytest.fixture
def own_pool(tmp_path, leak_key):
    """A pool of the test's own, for a test that kills it or starts it without the key."""
    made: list[Pool] = []

    def make(env: dict[str, str] | None = None) -> Pool:
        made.append(Pool(tmp_path / f"pool-{len(made)}", env or env_for(leak_key)))
        return made[-1]

    yield make
    for p in made:
        p.stop()


class Wrapper:
    """Prism's binary behind a script that records each Prism's pid and sends its log (at debug)
    to a file, so that the launcher starts Prism as it always does and the test reads everything
    Prism said. Not a copy to the launcher too: a Prism writing to a dead launcher's pipe dies of
    SIGPIPE, which would hide a Prism that outlives its launcher."""

    def __init__(self, where: Path, binary: str):
        where.mkdir(parents=True, exist_ok=True)
        self.path, self.log, self.pids_file = where / "prism", where / "prism.log", where / "pids"
        # Go's flags: the last one wins over the launcher's --log_level. -help: the launcher asks
        # which flags the binary takes, and reads its answer.
        self.path.write_text(f'#!/usr/bin/env bash\nif [ "$*" = -help ]; then exec "{binary}" -help; fi\n'
                             f'echo $$ >> "{self.pids_file}"\n'
                             f'exec "{binary}" "$@" --log_level=debug >> "{self.log}" 2>&1\n')
        self.path.chmod(0o755)

    def pids(self) -> list[int]:
        return [int(p) for p in self.pids_file.read_text().split()] if self.pids_file.exists() else []

    def logs(self) -> dict[str, bytes]:
        return {str(self.log): self.log.read_bytes()} if self.log.exists() else {}

    def running(self) -> list[int]:
        return [p for p in self.pids() if os.path.exists(f"/proc/{p}") and not _zombie(p)]


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return False


@pytest.fixture
def wrapper(tmp_path, prism_binary):
    w = Wrapper(tmp_path / "prism-bin", prism_binary)
    yield w
    # the launcher stops the Prism it started, also when its job failed
    wait_until(lambda: not w.running(), 30, f"Prism {w.running()} still runs after the launcher")


@pytest.fixture(params=VARIANTS)
def both(request, tmp_path, sandbox_factory, leak_key, wrapper):
    """Call with the sandboxes' settings: a Pair of the local runner and Prism (LOOPBACK, or
    EXTERNAL workers of the session's pool), each with its own sandbox started alike."""
    variant = request.param

    def make(*, balance: float = 1000.0, sandbox_args=(), price_per_token: float | None = None) -> Pair:
        env = env_for(leak_key)
        flags = ["--profile", variant, "--prism_location", str(wrapper.path)]
        scanned = wrapper.logs
        if variant == "prism-pool":
            p = request.getfixturevalue("pool")
            flags += ["--environment_config", p.address]
            env = p.launcher_env(env)
            scanned = lambda: {**wrapper.logs(), **p.logs()}
        sides = [Side(name, tmp_path / name, sandbox_factory(key=leak_key, balance=balance, args=list(sandbox_args)),
                      f, env, s, leak_key)
                 for name, f, s in (("local", [], dict), (variant, flags, scanned))]
        return Pair(*sides, price_per_token=price_per_token)

    return make


class JobService:
    """Prism as a job service of its own, as a cluster's: the launcher submits to it with
    --job_endpoint, and it outlives the launcher. Its log (at debug) goes to a file."""

    def __init__(self, binary: str, where: Path):
        where.mkdir(parents=True, exist_ok=True)
        self.port, self.log = free_port(), where / "prism-job-service.log"
        with open(self.log, "wb") as fh:
            self.proc = subprocess.Popen([binary, "--job_port", str(self.port), "--log_level", "debug",
                                          "--serve_http=false"], stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        wait_until(lambda: pools.listening(self.port), 30, "Prism's job service")
        channel = grpc.insecure_channel(self.endpoint)
        self.stub = beam_job_api_pb2_grpc.JobServiceStub(channel)

    @property
    def endpoint(self) -> str:
        return f"localhost:{self.port}"

    def jobs(self) -> list:
        """(JobInfo, Pipeline) of every job Prism was given."""
        infos = self.stub.GetJobs(beam_job_api_pb2.GetJobsRequest()).job_info
        return [(i, self.stub.GetPipeline(beam_job_api_pb2.GetJobPipelineRequest(job_id=i.job_id)).pipeline)
                for i in infos]

    def states(self) -> list[str]:
        return [beam_job_api_pb2.JobState.Enum.Name(i.state) for i, _ in self.jobs()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(30)


@pytest.fixture
def job_service(tmp_path, prism_binary):
    service = JobService(prism_binary, tmp_path / "job-service")
    yield service
    service.stop()

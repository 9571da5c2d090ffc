"""Beam's Prism runner as this launcher runs it (`--profile prism`, `prism-pool`; docs/RUNNERS.md).

- The binary: `make prism` builds Prism of the installed apache-beam into `.cache/prism/` (tools/
  prism.py); `--runner PrismRunner` takes it unless --prism_location or --job_endpoint is given.
  Beam would otherwise download one from GitHub at submit time, and without the internet fail
  with its traceback after the input's scan and the account's reads.
- Prism on loopback. Beam's Prism listens on every interface; `make prism`'s takes `-job_host`
  (tools/prism-bind.patch), which the launcher gives it: 127.0.0.1, or --prism_host. It then
  listens there alone, names that address (not "localhost") to its workers, and the launcher
  dials it there too. A binary without the flag (--prism_location, Beam's release) is started
  as it is, and listens where it listens; one at make prism's place is refused (built before
  the patch).
- Prism ends with the launcher. Beam starts it as a child process and stops it at exit, which a
  launcher killed (SIGKILL, OOM) never reaches: Prism would keep its job's data, its port and,
  with EXTERNAL workers, the job itself, sending requests for a DIR whose lock is stale. So
  Prism is started through a few lines of Python that ask Linux to signal it when the launcher
  dies (PR_SET_PDEATHSIG, kept across exec) and then become Prism.
  A job service of its own (--job_endpoint, a cluster's) is not the launcher's to end.
- LOOPBACK workers are Beam's SdkHarness threads in the launcher, whose failed bundles Beam
  prints to stderr (a worker process's own log): that print is dropped; the logged copy of the
  traceback stays for --verbose, the failure itself is one line (pipeline/checks/workers.py).
- Workers only for the launcher's own jobs. The launcher's worker service (LOOPBACK) listens on
  localhost, not on every interface as Beam's, and both it and a worker pool of this checkout
  (EXTERNAL, `make pool-up`) start a worker only for a job this launcher admitted between
  Prism's Prepare and Run (pipeline/workerpool.py): a StartWorker request from anyone else, or
  for a job someone else submitted to the same Prism, runs nothing. The pool holds no key: the
  launcher's reaches its job's worker with the admission. A pool on this machine that is not this
  checkout's (its code, its state directory) is refused before anything is read.
"""
from __future__ import annotations

import atexit
import copy
import functools
import ipaddress
import logging
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apache_beam.options.pipeline_options import (DebugOptions, PipelineOptions, PortableOptions, PrismRunnerOptions,
                                                  StandardOptions)
from apache_beam.portability import python_urns
from apache_beam.portability.api import beam_job_api_pb2, beam_job_api_pb2_grpc, beam_runner_api_pb2
from apache_beam.runners.portability import job_server
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.portability.prism_runner import PrismJobServer, PrismRunner
from apache_beam.runners.worker import sdk_worker_main
from apache_beam.transforms import environments
from apache_beam.utils import shared, subprocess_server
from apache_beam.version import __version__ as beam_version

from pipeline import workerpool
from pipeline.exits import UsageError
from service.credentials import ENV_VAR

CACHE = os.path.join(".cache", "prism")   # under the repository root
LOOPBACK = "127.0.0.1"   # where Prism listens unless --prism_host says otherwise
_TAKES_NONE = "drop --prism_location to run the Prism `make prism` builds, or drop --prism_host"
# argv: the launcher's pid, then Prism's command line. The parent may have died before prctl.
_END_WITH_LAUNCHER = """import ctypes, os, signal, sys
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
except AttributeError:   # not Linux: Beam's stop at exit only
    pass
if os.getppid() != int(sys.argv[1]):
    sys.exit(1)
os.execv(sys.argv[2], sys.argv[2:])
"""


class PrismHostOptions(PipelineOptions):
    @classmethod
    def _add_argparse_args(cls, parser: Any) -> None:
        parser.add_argument(
            "--prism_host", default=None,
            help="the IP address the Prism this launcher starts listens on, for its job service and its "
                 f"workers' Fn API (the job's data), and names to its workers (default {LOOPBACK}; 0.0.0.0: "
                 "every interface). Needs a Prism built by make prism")


def is_prism(opts: PipelineOptions) -> bool:
    return (opts.view_as(StandardOptions).runner or "").rsplit(".", 1)[-1] == "PrismRunner"


def build_path(root: str, version: str = beam_version) -> str:
    """Where `make prism` puts the Prism binary of Beam VERSION under ROOT."""
    return os.path.join(root, CACHE, f"v{version}", "prism")


@functools.cache
def takes_host(binary: str) -> bool:
    """Whether the Prism at BINARY takes -job_host, as its usage (-help) says."""
    try:
        usage = subprocess.run([binary, "-help"], capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return False
    return b"-job_host" in usage.stdout + usage.stderr


def use_build(opts: PipelineOptions) -> None:
    """--runner PrismRunner without --prism_location or --job_endpoint: `make prism`'s binary
    (of the repository, or of the working directory), else a usage error before anything is read;
    --prism_host checked."""
    prism = opts.view_as(PrismRunnerOptions)
    if not is_prism(opts):
        return
    host = opts.view_as(PrismHostOptions).prism_host
    if opts.view_as(PortableOptions).job_endpoint:
        if host is not None:
            raise UsageError("--prism_host: with --job_endpoint the launcher starts no Prism (that job service "
                             "listens where it was started)")
        return
    if host is not None:
        _check_host(host)
    if prism.prism_location:
        if host is not None and os.path.isfile(prism.prism_location) and not takes_host(prism.prism_location):
            raise UsageError(f"--prism_host {host}: the Prism at {prism.prism_location} takes no address (it "
                             f"listens where it listens; Beam's release on every interface): {_TAKES_NONE}")
        return
    for root in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()):
        if os.path.isfile(path := build_path(root)):
            if not takes_host(path):
                raise UsageError(f"the Prism at {path} was built without tools/prism-bind.patch (it would listen on "
                                 "every interface): run `make prism`")
            prism.prism_location = path
            return
    raise UsageError(f"--runner PrismRunner: no Prism at {build_path('.')}: run `make prism` (builds it from the "
                     "Go module proxy), or pass --prism_location PATH (a binary, or Beam's release URL)")


def _check_host(host: str) -> None:
    """HOST an IP address of this machine, where a server can listen."""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise UsageError(f"--prism_host {host!r}: not an IP address (127.0.0.1, ::1, an address of this "
                         "machine's, 0.0.0.0 for every interface)") from None
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as probe:
            probe.bind((host, 0))
    except OSError as exc:
        raise UsageError(f"--prism_host {host}: Prism cannot listen there ({exc.strerror})") from None


def _dialed(host: str, port: int) -> str:
    """Where the launcher reaches a Prism listening on HOST:PORT: that address (on loopback for
    every interface), never a name another listener could answer for."""
    ip = ipaddress.ip_address(host)
    if ip.is_unspecified:
        ip = ipaddress.ip_address(LOOPBACK)
    return f"[{ip}]:{port}" if ip.version == 6 else f"{ip}:{port}"


def own_pool(opts: PipelineOptions) -> Path | None:
    """The state directory of the pool a Prism job's EXTERNAL workers come from when it is this
    checkout's (pipeline/workerpool.py `own_pool`); else None, or a usage error for a pool on this
    machine that is another checkout's."""
    return workerpool.own_pool(opts.view_as(PortableOptions)) if is_prism(opts) else None


# Beam's classes are unannotated: their methods are called by name, which mypy's strict checks
# (untyped_calls_exclude) leave to Beam, where super() would not.
class _JobServer(PrismJobServer):
    endpoint = ""
    started: str | None = None   # the address of the Prism this launcher started, for summary.json

    def __init__(self, options: PipelineOptions):
        PrismJobServer.__init__(self, options)
        self._host = options.view_as(PrismHostOptions).prism_host

    def subprocess_cmd_and_endpoint(self) -> tuple[list[str], str]:
        """Beam's, bound to --prism_host (127.0.0.1) when the binary takes an address."""
        cmd, self.endpoint = super().subprocess_cmd_and_endpoint()
        cmd = list(map(str, cmd))
        if takes_host(cmd[0]):
            host = self._host or LOOPBACK
            cmd.append(f"--job_host={host}")
            self.endpoint = _dialed(host, int(self.endpoint.rsplit(":", 1)[1]))
        elif self._host is not None:   # a binary Beam downloaded: use_build checked the others
            raise UsageError(f"--prism_host {self._host}: the Prism at {cmd[0]} takes no address: {_TAKES_NONE}")
        _JobServer.started = self.endpoint
        return [sys.executable, "-S", "-c", _END_WITH_LAUNCHER, str(os.getpid()), *cmd], self.endpoint

    def start(self) -> beam_job_api_pb2_grpc.JobServiceStub:
        """Beam's, dialing Prism where it listens: Beam's dials localhost, which could reach
        another listener on ::1 at the same port."""
        if self._server is None:
            self._local_temp_root = tempfile.mkdtemp(prefix="beam-temp")
            cmd, endpoint = self.subprocess_cmd_and_endpoint()
            logger = logging.getLogger(type(self).__name__)
            if self._log_filter is not None:   # as Beam's, for its console log kind
                logger.addFilter(self._log_filter)
                logger.setLevel(logging.INFO)
            self._server = _Subprocess(endpoint, cmd, logger)
        stub: beam_job_api_pb2_grpc.JobServiceStub = self._server.start()
        return stub


class _Subprocess(subprocess_server.SubprocessServer):
    """Beam's server process, reached at ENDPOINT."""

    def __init__(self, endpoint: str, cmd: list[str], logger: logging.Logger):
        subprocess_server.SubprocessServer.__init__(self, beam_job_api_pb2_grpc.JobServiceStub, cmd,
                                                    port=int(endpoint.rsplit(":", 1)[1]), logger=logger)
        self._endpoint = endpoint

    def start_process(self) -> tuple[Any, str]:
        process, _ = subprocess_server.SubprocessServer.start_process(self)
        return process, self._endpoint


class _StopOnExit(job_server.StopOnExitJobServer):
    def __init__(self, options: PipelineOptions):
        job_server.StopOnExitJobServer.__init__(self, _JobServer(options))

    def start(self) -> beam_job_api_pb2_grpc.JobServiceStub:
        stub: beam_job_api_pb2_grpc.JobServiceStub = job_server.StopOnExitJobServer.start(self)
        return stub


class _Handle(JobServiceHandle):
    """Beam's submission, with the job admitted to its workers between Prepare and Run."""

    def __init__(self, job_service: beam_job_api_pb2_grpc.JobServiceStub, options: PipelineOptions,
                 admit: Callable[[str, str], None]):
        JobServiceHandle.__init__(self, job_service, options, retain_unknown_options=True)   # as PrismRunner's
        self._admit = admit
        self._prism = ""

    def prepare(self, proto_pipeline: beam_runner_api_pb2.Pipeline) -> beam_job_api_pb2.PrepareJobResponse:
        response: beam_job_api_pb2.PrepareJobResponse = super().prepare(proto_pipeline)
        # Prism's own address as it names it: its artifact endpoint is every endpoint it gives workers
        self._prism = response.artifact_staging_endpoint.url
        return response

    def run(self, preparation_id: str) -> Any:
        self._admit(self._prism, preparation_id)   # Prism's job id is its preparation id
        return super().run(preparation_id)


def address(opts: PipelineOptions) -> str | None:
    """Where the job service was: --job_endpoint's, else the Prism this launcher started."""
    return opts.view_as(PortableOptions).job_endpoint or _JobServer.started


class Runner(PrismRunner):
    """Beam's PrismRunner whose Prism, one for all of a command's pipelines as Beam's, ends with
    the launcher, and whose workers run only this launcher's jobs."""
    shared_handle = shared.Shared()

    def __init__(self) -> None:
        PrismRunner.__init__(self)
        self._own_jobs = workerpool.OwnJobs()

    def default_job_server(self, options: PipelineOptions) -> _StopOnExit:
        def make() -> _StopOnExit:
            return _StopOnExit(options)
        if options.view_as(DebugOptions).lookup_experiment("disable_prism_server_singleton"):
            return make()
        server: _StopOnExit = Runner.shared_handle.acquire(make)
        return server

    def create_job_service(self, options: PipelineOptions) -> _Handle:
        """Beam's, with the job admitted to its workers."""
        portable = options.view_as(PortableOptions)
        if portable.job_endpoint:
            stub = job_server.ExternalJobServer(portable.job_endpoint, portable.job_server_timeout).start()
        else:
            stub = self.default_job_server(options).start()
        return _Handle(stub, options, functools.partial(self._admit, options))

    def _admit(self, options: PipelineOptions, prism: str, job: str) -> None:
        """JOB of the Prism at PRISM (its address as it names it to workers): its workers, the
        launcher's own (LOOPBACK) and those of this checkout's pool, which get the launcher's key
        when it comes from the environment."""
        self._own_jobs.add(prism, job)
        # PortableRunner has unset the runner by now: is_prism no longer holds
        if (state := workerpool.own_pool(options.view_as(PortableOptions))) is not None:
            given = options.get_all_options()
            key = None if given.get("api_key_file") or given.get("api_key_secret") else os.environ.get(ENV_VAR)
            atexit.register(workerpool.admit(state, prism, job, key).unlink, missing_ok=True)

    def start_and_replace_loopback_environments(  # type: ignore[override]  # Beam's is static; it calls self's
            self, pipeline: beam_runner_api_pb2.Pipeline, options: PipelineOptions) -> list[Callable[[], None]]:
        """Beam's, with the launcher's worker service on localhost and for its own jobs only."""
        portable = copy.deepcopy(options.view_as(PortableOptions))
        debug = options.view_as(DebugOptions)
        cleanups: list[Callable[[], None]] = []
        for env in pipeline.components.environments.values():
            if env.urn != python_urns.EMBEDDED_PYTHON_LOOPBACK:
                continue
            servicer = workerpool.Servicer(
                self._own_jobs.take, use_process=debug.lookup_experiment("use_loopback_process_worker", False),
                state_cache_size=sdk_worker_main._get_state_cache_size_bytes(options=options),
                data_buffer_time_limit_ms=sdk_worker_main._get_data_buffer_time_limit_ms(debug.experiments or []))
            portable.environment_type = "EXTERNAL"
            portable.environment_config, server = workerpool.serve(servicer)
            # as Beam's own call: an external environment needs no context
            external = environments.ExternalEnvironment.from_options(portable).to_runner_api(None)  # type: ignore[arg-type]
            env.urn, env.payload = external.urn, external.payload
            cleanups.append(functools.partial(server.stop, 1))
        return cleanups


def runner() -> Runner:
    from apache_beam.runners.worker import sdk_worker
    sdk_worker.print = lambda *args, **kwargs: None  # type: ignore[attr-defined]  # the module's own print only: see above
    return Runner()

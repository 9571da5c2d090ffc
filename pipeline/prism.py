"""Beam's Prism runner as this launcher runs it (`--profile prism`, `prism-pool`; docs/RUNNERS.md).

- The binary: `make prism` builds Prism of the installed apache-beam into `.cache/prism/` (tools/
  prism.py); `--runner PrismRunner` takes it unless --prism_location or --job_endpoint is given.
  Beam would otherwise download one from GitHub at submit time, and without the internet fail
  with its traceback after the input's scan and the account's reads.
- Prism ends with the launcher. Beam starts it as a child process and stops it at exit, which a
  launcher killed (SIGKILL, OOM) never reaches: Prism would keep its job's data, its port and,
  with EXTERNAL workers, the job itself, sending requests for a DIR whose lock is stale. So
  Prism is started through a few lines of Python that ask Linux to signal it when the launcher
  dies (PR_SET_PDEATHSIG, kept across exec) and then become Prism.
  A job service of its own (--job_endpoint, a cluster's) is not the launcher's to end.
- LOOPBACK workers are Beam's SdkHarness threads in the launcher, whose failed bundles Beam
  prints to stderr (a worker process's own log): that print is dropped; the logged copy of the
  traceback stays for --verbose, the failure itself is one line (pipeline/checks/workers.py).
"""
from __future__ import annotations

import os
import sys

from apache_beam.options.pipeline_options import DebugOptions, PortableOptions, PrismRunnerOptions, StandardOptions
from apache_beam.runners.portability import job_server
from apache_beam.runners.portability.prism_runner import PrismJobServer, PrismRunner
from apache_beam.utils import shared
from apache_beam.version import __version__ as beam_version

from pipeline.exits import UsageError

CACHE = os.path.join(".cache", "prism")   # under the repository root
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


def is_prism(opts) -> bool:
    return (opts.view_as(StandardOptions).runner or "").rsplit(".", 1)[-1] == "PrismRunner"


def build_path(root: str, version: str = beam_version) -> str:
    """Where `make prism` puts the Prism binary of Beam VERSION under ROOT."""
    return os.path.join(root, CACHE, f"v{version}", "prism")


def use_build(opts) -> None:
    """--runner PrismRunner without --prism_location or --job_endpoint: `make prism`'s binary
    (of the repository, or of the working directory), else a usage error before anything is read."""
    prism = opts.view_as(PrismRunnerOptions)
    if not is_prism(opts) or prism.prism_location or opts.view_as(PortableOptions).job_endpoint:
        return
    for root in (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.getcwd()):
        if os.path.isfile(path := build_path(root)):
            prism.prism_location = path
            return
    raise UsageError(f"--runner PrismRunner: no Prism at {build_path('.')}: run `make prism` (builds it from the "
                     "Go module proxy), or pass --prism_location PATH (a binary, or Beam's release URL)")


class _JobServer(PrismJobServer):
    started: str | None = None   # the address of the Prism this launcher started, for summary.json

    def subprocess_cmd_and_endpoint(self):
        cmd, endpoint = super().subprocess_cmd_and_endpoint()
        _JobServer.started = endpoint
        return [sys.executable, "-S", "-c", _END_WITH_LAUNCHER, str(os.getpid()), *map(str, cmd)], endpoint


def address(opts) -> str | None:
    """Where the job service was: --job_endpoint's, else the Prism this launcher started."""
    return opts.view_as(PortableOptions).job_endpoint or _JobServer.started


class Runner(PrismRunner):
    """Beam's PrismRunner whose Prism, one for all of a command's pipelines as Beam's, ends with
    the launcher."""
    shared_handle = shared.Shared()

    def default_job_server(self, options):
        make = lambda: job_server.StopOnExitJobServer(_JobServer(options))
        if options.view_as(DebugOptions).lookup_experiment("disable_prism_server_singleton"):
            return make()
        return Runner.shared_handle.acquire(make)


def runner() -> Runner:
    from apache_beam.runners.worker import sdk_worker
    sdk_worker.print = lambda *args, **kwargs: None  # type: ignore[attr-defined]  # the module's own print only: see above
    return Runner()

"""A job that failed because of where it ran, not of what it read: in one line that says what to
do. Three such causes the launcher can name from the runner's error:

- a worker without the API key. Every worker loads the key itself in setup(), before its first
  request (service/credentials.py `KeySource`): from its own environment, a file at the same
  path as on the launcher, or a secret. The launcher loads it too, so where the workers share its
  process (the local runner, LOOPBACK workers) its own check has covered them before anything
  is sent. EXTERNAL workers (a worker pool, a Flink cluster) are processes of their own whose
  environment the launcher cannot see: there the first worker without a key fails the job.
- the workers gone mid-run (their pool or host died): Prism says "SDK worker disconnected".

For a worker pool on this machine the line gives the command of tools/pool.py that starts it
again on the port --environment_config names (`make pool-up` alone starts on 50000); a pool
elsewhere is started by whoever runs it.
- the runner gone mid-run (Prism's process died): its job service stops answering. A runner
  this command started ended the job with it; a job service of its own (--job_endpoint, a
  cluster's) may still run the job, which must end before the next run on the same DIR.
"""
from __future__ import annotations

import socket

import grpc
from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

from pipeline.settings.job import Job
from service.credentials import ENV_VAR, MissingApiKeyError
from transforms.errors import one_line
from transforms.money import journal

MISSING = MissingApiKeyError.__name__ + ":"   # a worker's exception reaches the launcher as text
DISCONNECTED = "SDK worker disconnected"
RUNNER_GONE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED)
THIS_MACHINE = ("localhost", "127.0.0.1", "[::1]", "0.0.0.0")


def _local_port(pool: str) -> str | None:
    """The port of the pool at POOL (host:port) when it is on this machine; None for one elsewhere."""
    host, _, port = pool.rpartition(":")
    return port if port.isdigit() and host in (*THIS_MACHINE, socket.gethostname()) else None


def runner_gone(exc: Exception) -> bool:
    """Whether EXC is the runner's connection lost: its process gone, or cancelled."""
    return isinstance(exc, grpc.RpcError) and exc.code() in RUNNER_GONE


def message(job: Job, exc: Exception) -> str | None:
    """The line for a job that failed for one of the causes above; None for any other failure."""
    portable = job.opts.view_as(PortableOptions)
    pool = portable.environment_config if portable.environment_type == "EXTERNAL" else None
    workers = f"the workers of the worker pool at {pool}" if pool else "the workers"
    paid = (f"What was paid for is journaled in {journal.journal_dir(job.opts.output, job.run_id)}; "
            f"run {job.again} then: nothing is paid twice.")
    if isinstance(exc, grpc.RpcError) and runner_gone(exc):
        if portable.job_endpoint:   # a job service of its own: the job may outlive the connection
            return (f"the job service at {portable.job_endpoint} stopped answering mid-run ({exc.code().name}): the "
                    f"job may still run there; once it has ended: {paid}")
        runner = job.opts.view_as(StandardOptions).runner
        return f"the runner ({runner}, started by this command) stopped mid-run ({exc.code().name}). {paid}"
    error = one_line(exc, worker=True)
    source = job.key_source
    port = _local_port(pool) if pool else None
    if DISCONNECTED in error:   # a pool of this checkout gives its workers the launcher's key
        back = (f"start the pool again (`POOL_PORT={port} make pool-up`)" if port else
                "start the pool again" if pool else "bring the workers back")
        return f"{workers} went away mid-run ({DISCONNECTED}): {back}. {paid}"
    if MISSING not in error:
        return None
    said = error.split(MISSING, 1)[1].strip()
    if source.secret or source.file:
        where = (f"give the workers' identity access to the secret {source.secret}" if source.secret else
                 f"put the key file at {source.file} on every worker (a path they read: the launcher's file is its own)")
        return f"{workers} could not read the API key ({said}): {where}. {paid}"
    start = "start the pool with it in its environment" if pool else "set it where they run"
    return (f"{workers} found no {ENV_VAR} in their own environment (the launcher's is not theirs): {start}, or "
            f"pass --api-key-file PATH on a path every worker reads, or --api-key-secret NAME. {paid}")

"""Running a Beam pipeline locally without downloads, and reading its counters."""
from __future__ import annotations

import os
from typing import Any

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PortableOptions, StandardOptions, WorkerOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.runners.portability.fn_api_runner.fn_runner import ExtendedProvisionInfo
from apache_beam.runners.portability.portable_runner import JobServiceHandle

from pipeline import prism
from pipeline.terminal import OWN_LOGGERS

LOCAL_RUNNERS = (None, "DirectRunner", "FnApiRunner")
HARNESS_LOG_LEVEL = "WARNING"   # the rest, in local worker processes, unless --default_sdk_harness_log_level


def is_local(opts) -> bool:
    return opts.view_as(StandardOptions).runner in LOCAL_RUNNERS


def in_process(opts) -> bool:
    """The local runner with its workers in this process (threads), not in processes of their own."""
    return is_local(opts) and opts.view_as(DirectOptions).direct_running_mode != "multi_processing"


def one_worker(opts) -> bool:
    """The local runner with one worker: no other worker to share the input with."""
    return is_local(opts) and opts.view_as(DirectOptions).direct_num_workers == 1


def local_workers(opts) -> int:
    """How many workers the local runner runs (FnApiRunner's reading of --direct_num_workers)."""
    return opts.view_as(DirectOptions).direct_num_workers or os.cpu_count() or 1


def make_runner(opts):
    """The DirectRunner would first try to download Prism; FnApiRunner runs the same pipeline
    locally (honouring --direct_num_workers and --direct_running_mode) with nothing fetched.

    Worker processes of their own (multi_processing) take their options from the ones the runner
    provides them, none by default. They are given the job's options, as Beam's DirectRunner
    gives them: their FileSystems need the job's (an s3:// input reaches --s3_endpoint_url, not
    AWS's own endpoint), their log levels keep the user's terminal to the driver's console (a
    worker logs ~20 lines at INFO otherwise), and --profile_cpu profiles their bundles (the
    driver only waits for them)."""
    if prism.is_prism(opts):   # Beam's PrismRunner, its Prism ending with this process
        return prism.runner()
    if not is_local(opts):
        return None
    worker = opts.view_as(WorkerOptions)
    provided = {**opts.get_all_options(drop_default=True),
                "default_sdk_harness_log_level": worker.default_sdk_harness_log_level or HARNESS_LOG_LEVEL,
                "sdk_harness_log_level_overrides": {**{name: "INFO" for name in OWN_LOGGERS},
                                                    **(worker.sdk_harness_log_level_overrides or {})}}
    return FnApiRunner(provision_info=ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(
        pipeline_options=JobServiceHandle.encode_pipeline_options(provided),
        retrieval_token="unused-retrieval-token")))


def described(opts) -> dict[str, Any]:
    """summary.json's `runner`: the runner the run used and how its workers ran; Prism's (or a
    job service's) address and a worker pool's where it used them. Addresses only: a PROCESS or
    DOCKER environment's config (a command, its environment) is not written."""
    name = opts.view_as(StandardOptions).runner or "DirectRunner"
    if is_local(opts):
        mode = opts.view_as(DirectOptions).direct_running_mode
        return {"name": name, "runs_as": "FnApiRunner", "running_mode": mode,
                "workers": 1 if mode == "in_memory" else local_workers(opts)}
    portable = opts.view_as(PortableOptions)
    found: dict[str, Any] = {"name": name, "environment_type": portable.environment_type}
    job_service = prism.address(opts) if prism.is_prism(opts) else portable.job_endpoint
    if job_service:
        found["prism" if prism.is_prism(opts) else "job_endpoint"] = _host_port(job_service)
    if portable.environment_type == "EXTERNAL" and portable.environment_config:
        found["worker_pool"] = _host_port(portable.environment_config)
    return found


def _host_port(address: str) -> str:
    """ADDRESS without any user or password before a host (user:secret@host:port)."""
    return address.rsplit("@", 1)[-1]


def counters(result) -> dict[str, int]:
    """The job's Beam counters (namespace embedpipe), summed over steps."""
    totals: dict[str, int] = {}
    try:
        found = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("embedpipe"))["counters"]
    except Exception:  # some runners report no metrics; the files stay the source of truth
        return totals
    for c in found:
        totals[c.key.metric.name] = totals.get(c.key.metric.name, 0) + (c.committed or c.attempted or 0)
    return totals

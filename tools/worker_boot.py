"""What the Beam SDK container's boot does before a Python worker runs, for the worker pool of
tools/pool.py (the command it starts each worker with): the job's options from the runner's
provision service, then `apache_beam.runners.worker.sdk_worker_main` with them in its environment.

worker_pool_main alone starts each worker as a bare SdkHarness, which never sees the job's
options, and a worker needs them: its FileSystems (an s3:// path reaches the job's
--s3_endpoint_url, not AWS's own endpoint), its log levels, its pickler. A Flink cluster's pool
(the SDK container started with --worker_pool) boots its workers this way; the container also
installs the staged artifacts, which a pool on this project's .venv needs not.

The worker's semi-persistent directory (where the container puts the staged files, and where
Beam's Python worker only looks for them) is the one --semi_persistent_directory names, shared
by the pool's workers as the container's /tmp is: nothing is made per worker, so a long-lived
pool leaves nothing behind; tools/pool.py gives its state directory's `workers/`.

    python -m tools.worker_boot --semi_persistent_directory=DIR --id=ID --provision_endpoint=HOST:PORT \\
        --control_endpoint=HOST:PORT --logging_endpoint=HOST:PORT [--artifact_endpoint=HOST:PORT]
"""
from __future__ import annotations

import argparse
import os
import sys

import grpc
from apache_beam.portability.api import beam_provision_api_pb2, beam_provision_api_pb2_grpc, endpoints_pb2
from google.protobuf import json_format, text_format


def _descriptor(url: str) -> str:
    return str(text_format.MessageToString(endpoints_pb2.ApiServiceDescriptor(url=url)))


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m tools.worker_boot")
    for name in ("semi_persistent_directory", "id", "provision_endpoint", "control_endpoint", "logging_endpoint",
                 "artifact_endpoint"):
        ap.add_argument(f"--{name}", required=name != "artifact_endpoint")
    args = ap.parse_args(argv)
    with grpc.insecure_channel(args.provision_endpoint) as channel:
        info = beam_provision_api_pb2_grpc.ProvisionServiceStub(channel).GetProvisionInfo(
            beam_provision_api_pb2.GetProvisionInfoRequest(), metadata=[("worker_id", args.id)]).info
    env = {**os.environ, "WORKER_ID": args.id, "PIPELINE_OPTIONS": json_format.MessageToJson(info.pipeline_options),
           "CONTROL_API_SERVICE_DESCRIPTOR": _descriptor(args.control_endpoint),
           "LOGGING_API_SERVICE_DESCRIPTOR": _descriptor(args.logging_endpoint),
           "SEMI_PERSISTENT_DIRECTORY": args.semi_persistent_directory,
           "RUNNER_CAPABILITIES": " ".join(info.runner_capabilities)}
    os.execve(sys.executable, [sys.executable, "-m", "apache_beam.runners.worker.sdk_worker_main"], env)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Paths the workers must reach. A runner whose workers always run on other hosts (Dataflow)
cannot read an input or write an output on the launcher's local disk: the job would start,
pay for requests, and fail on the first file, or write DIR where nobody reads it. Refused before
anything is sent. A Flink or portable cluster may mount one shared filesystem at the same path
on every host, so a local path is left to the user there (docs/RUNNERS.md)."""
from __future__ import annotations

from collections.abc import Sequence

from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from pipeline.exits import UsageError

REMOTE_ONLY_RUNNERS = ("DataflowRunner",)


def _is_local(path: str) -> bool:
    return FileSystems.get_scheme(path) in (None, "file")


def check_workers_reach_paths(opts: PipelineOptions, others: Sequence[tuple[str, str]] = ()) -> None:
    """A local --input, --output or --known, or one of OTHERS ((name, path): a command's DIR), on
    a runner whose workers are elsewhere: UsageError."""
    runner = opts.view_as(StandardOptions).runner
    if runner not in REMOTE_ONLY_RUNNERS:
        return
    paths = [("--input", opts.input), ("--output", getattr(opts, "output", None))]
    paths += [("--known", k) for k in getattr(opts, "known", None) or []] + list(others)
    for flag, path in paths:
        if path and _is_local(path):
            raise UsageError(f"{flag} {path} is on this machine's disk, and {runner}'s workers run on "
                             f"other hosts: put it on an object store they read (gs://...)")

"""Beam's own cost per element on this machine, on the runner the job uses (FnApiRunner, in
process): a fused Map step, and a GroupByKey carrying a chunk-sized payload (the job's
Dedupe and duplicate-id steps move every chunk text through one)."""
from __future__ import annotations

import resource

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

PAYLOAD = ("x" * 1700, 400, ("doc-000001", 0, 1, 0, 400, 400, ()))   # ~ a chunk's text and ref


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _run(n: int, maps: int = 0, payload=None, gbk: bool = False) -> float:
    p = beam.Pipeline(runner=FnApiRunner(), options=PipelineOptions([]))
    pc = p | "Create" >> beam.Create(range(n), reshuffle=False)
    if payload is not None:
        pc = pc | "Payload" >> beam.Map(lambda i: (str(i), payload))
    for k in range(maps):
        pc = pc | f"Map{k}" >> beam.Map(lambda x: x)
    if gbk:
        pc = pc | beam.GroupByKey()
    pc | beam.combiners.Count.Globally()
    t = _cpu()
    p.run().wait_until_finish()
    return _cpu() - t


def measure(n: int = 100_000) -> dict[str, float]:
    """Microseconds of CPU per element."""
    _run(1000)   # warm up: imports, first-run setup
    plain, mapped = _run(n), _run(n, maps=10)
    carried, grouped = _run(n // 4, payload=PAYLOAD), _run(n // 4, payload=PAYLOAD, gbk=True)
    return {"fused Map step": (mapped - plain) / n / 10 * 1e6,
            "GroupByKey of a ~1.7 KB chunk payload": (grouped - carried) / (n // 4) * 1e6}

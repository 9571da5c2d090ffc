"""What a run would send and what it may cost at worst: the cheap bound from the driver's scan,
and, only when that bound does not fit, the exact count (the whole corpus read and split,
nothing sent)."""
from __future__ import annotations

import logging
from typing import NamedTuple
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.metrics import Metrics

from pipeline.checks import reading
from pipeline.checks.inputs import InputInfo
from pipeline.checks.prior import Prior
from pipeline.checks.scan import Scan
from pipeline.graph import Claiming, claims_for, packed_requests
from pipeline.runner import counters, make_runner
from pipeline.settings.job import Job
from transforms.money import preflight
from transforms.money.preflight import WorstCaseMicro
from transforms.pack import request_totals

log = logging.getLogger("embedpipe")

TOTALS = ("plan_requests", "plan_inputs", "plan_chunks", "plan_tokens")


def _count_totals(totals):
    for name, value in zip(TOTALS, totals, strict=True):
        Metrics.counter("embedpipe", name).inc(value)


def exact_totals(job: Job, info: InputInfo, prior: Prior, scan: Scan, price: float,
                 margin: float) -> dict[str, int]:
    """Beam counters of a counting pipeline: documents, changed_<change> (documents), plan_* totals,
    plan_worst_case_micro. It streams as the run would (the view's document index and the
    known texts indexed, not grouped), with claims and indexes of its own, discarded afterwards."""
    p = beam.Pipeline(runner=make_runner(job.opts), options=job.opts)
    with claims_for(job, f"{job.run_id}-count") as claiming:
        return _count(p, job, info, prior, scan, price, margin, claiming)


def _count(p: beam.Pipeline, job: Job, info: InputInfo, prior: Prior, scan: Scan, price: float, margin: float,
           claiming: Claiming) -> dict[str, int]:
    _, changed, _, requests = packed_requests(p, job, info, prior, duplicate_ids=scan.duplicate_ids,
                                              claiming=claiming, count_only=True)
    (changed  # a repeated id comes once per row: counted once (ids only cross the shuffle)
     | "ChangedIds" >> beam.FlatMap(lambda t: zip(t.column("doc_id").to_pylist(), t.column("change").to_pylist(), strict=True))
     | "Distinct" >> beam.Distinct()
     | "CountChanges" >> beam.Map(lambda kv: Metrics.counter("embedpipe", f"changed_{kv[1]}").inc()))
    request_totals(requests) | "Count" >> beam.Map(_count_totals)
    (requests | "WorstCase" >> WorstCaseMicro(price, margin)
     | "CountWorstCase" >> beam.Map(lambda micro: Metrics.counter("embedpipe", "plan_worst_case_micro").inc(micro)))
    try:
        result = p.run()
        result.wait_until_finish()
    except Exception as exc:  # a worker's error arrives wrapped by the runner
        error = reading.before_sending(info, exc)
        if error is exc:
            raise
        raise error from None
    totals = counters(result)
    # rows whose text had gone when they came: delivered with it, not sent
    totals["plan_chunks"] = totals.get("plan_chunks", 0) + len(claiming.late())
    return totals


def bound_micro(job: Job, scan: Scan, price: float, margin: float) -> int:
    chunking = job.chunking   # a cut placed at a boundary may come boundary_window before the limit
    shortest = max(1, int(chunking.chunk_tokens * (1 - chunking.boundary_window)))
    return preflight.bound_worst_case_micro(scan.tokens_bound, scan.rows, shortest, chunking.overlap_tokens,
                                            price, margin)


class Part(NamedTuple):
    """One model's share of a run (a switch has two): what it reads against and its price."""
    job: Job
    info: InputInfo
    prior: Prior
    scan: Scan
    price: float
    margin: float


def fits(parts: Sequence[Part], spendable_rub: float | None) -> tuple[bool, str]:
    """(do the PARTS together fit the spendable amount, how that was decided)."""
    if preflight.fits(sum(bound_micro(p.job, p.scan, p.price, p.margin) for p in parts), spendable_rub):
        return True, "bound"
    log.info("preflight: an upper bound of the cost does not fit the spendable amount; counting the "
             "tokens exactly first (nothing is sent)")
    worst = sum(exact_totals(p.job, p.info, p.prior, p.scan, p.price, p.margin).get("plan_worst_case_micro", 0)
                for p in parts)
    return preflight.fits(worst, spendable_rub), "exact"

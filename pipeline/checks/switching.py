"""Whether a run (or plan) switches DIR to another model or chunking, and the jobs it takes:
the served view's model and chunking for the day's changes, then the ones DIR moves to
(pipeline/outdir/switch.py). A view is its model, its length and its chunking
(pipeline/checks/chunking.py): a change of any of them is a switch.

- `--switch-model` with the view DIR serves: a plain `--sync` (a switch under way to another
  is abandoned).
- `--switch-model` with another: its view is built beside the served one; a switch under way
  to a third is abandoned, and what it cost is named. Nothing of it is lost: its vectors stay
  in DIR's history, and a later switch to that model reuses them.
- Without the flag, another model or chunking is a usage error naming it (pipeline/checks/prior.py).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from pipeline.checks.chunking import describe, view_chunking
from pipeline.exits import UsageError
from pipeline.outdir import OutputDir
from pipeline.outdir import switch as switches
from pipeline.outdir.switch import Switch
from pipeline.settings.job import SYNC, Job, catalogue
from service.catalog import ConfigError, ModelSpec, get_model

log = logging.getLogger("embedpipe")


@dataclasses.dataclass(frozen=True)
class Switching:
    served: Job                 # the served view's model: the day's changes
    target: Job                 # the model DIR moves to, a run of its own
    record: Switch


@dataclasses.dataclass(frozen=True)
class Decision:
    switching: Switching | None       # None: a plain run
    abandoned: dict[str, Any] | None = None   # a switch to another model given up: to, runs, spent_rub


def _aims_at(record: Switch, out: OutputDir, job: Job) -> bool:
    """Whether RECORD's switch goes where JOB does. A record that does not say its chunking
    (written before records did) goes by its target's view, when it has one."""
    if (record.to_model, record.to_dimensions) != (job.model.name, job.dimensions):
        return False
    if record.to_chunking is not None:
        return record.to_chunking == job.chunking
    target = out.target().view
    return target is None or view_chunking(target, job.model, job.chunking) == job.chunking


def _served_model(job: Job, out: OutputDir, model: str) -> ModelSpec:
    if model == job.model.name:
        return job.model
    try:
        return get_model(catalogue(job.opts), model)
    except ConfigError as exc:
        raise UsageError(f"--output {out.path} serves {model}, which the model catalogue no longer has "
                         f"({exc}): its view cannot be kept current during a switch; write {job.model.name} "
                         "to another --output, with --known to reuse what is paid") from None


def decide(job: Job, out: OutputDir, *, act: bool) -> Decision:
    """ACT (run): abandon, start and settle switches on disk; plan only looks."""
    if act:
        switches.settle(out)
    view, record = out.view, switches.load(out)
    if not job.switching:
        return Decision(None)
    if job.mode != SYNC:
        raise UsageError("--switch-model goes with --sync: the input must be the whole corpus, so that the "
                         "view of the new model can take over from the served one")
    abandoned = None
    if record is not None and not _aims_at(record, out, job):
        abandoned = {"to": switches.side(record.to_model, record.to_dimensions, record.to_chunking),
                     "runs": list(record.runs), "spent_rub": switches.spent_rub(out, record)}
        if act:
            switches.end(out)
            log.warning("abandoned the switch of %s to %s (length %d%s): %.6f RUB spent on it over %d runs; its "
                        "vectors stay in history/ and a switch back to it reuses them", out.path,
                        record.to_model, record.to_dimensions,
                        f", {describe(record.to_chunking)}" if record.to_chunking else "",
                        abandoned["spent_rub"], len(record.runs))
        record = None
    if view is None:
        return Decision(None, abandoned)
    served_model = _served_model(job, out, view.model)
    chunking = view_chunking(view, served_model, job.chunking)
    if (view.model, view.dimensions, chunking) == (job.model.name, job.dimensions, job.chunking):
        return Decision(None, abandoned)
    if chunking is None:
        raise UsageError(f"--output {out.path} holds {describe(None)} (a view of an earlier version, cut with "
                         "other split settings than this run's): its view cannot be kept current during a switch; "
                         "pass the --overlap-tokens and split.boundary_window it was made with, or write to another "
                         f"--output with --known '{out.join('history/*/embeddings-*.parquet')}'")
    if record is None:
        record = Switch.start(view, chunking, job.model.name, job.dimensions, job.chunking)
        if act:
            switches.save(out, record)
    served = job.for_view(served_model, view.dimensions, chunking)
    return Decision(Switching(served, job.next_run(), record), abandoned)

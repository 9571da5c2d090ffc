"""Whether a run (or plan) switches DIR to another model, and the jobs it takes: the served
view's model for the day's changes, then the model DIR moves to (pipeline/outdir/switch.py).

- `--switch-model` with the model DIR serves: a plain `--sync` (a switch under way to another
  model is abandoned).
- `--switch-model` with another model: that model's view is built beside the served one; a
  switch under way to a third model is abandoned, and what it cost is named. Nothing of it is
  lost: its vectors stay in DIR's history, and a later switch to that model reuses them.
- Without the flag, another model is a usage error naming it (pipeline/checks/prior.py).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from pipeline.exits import UsageError
from pipeline.outdir import OutputDir
from pipeline.outdir import switch as switches
from pipeline.outdir.switch import Switch
from pipeline.settings.job import SYNC, Job, catalogue
from service.catalog import ConfigError, get_model

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
    wanted = (job.model.name, job.dimensions)
    abandoned = None
    if record is not None and record.to != wanted:
        abandoned = {"to": {"model": record.to_model, "dimensions": record.to_dimensions},
                     "runs": list(record.runs), "spent_rub": switches.spent_rub(out, record)}
        if act:
            switches.end(out)
            log.warning("abandoned the switch of %s to %s (length %d): %.6f RUB spent on it over %d runs; its "
                        "vectors stay in history/ and a switch back to it reuses them", out.path,
                        record.to_model, record.to_dimensions, abandoned["spent_rub"], len(record.runs))
        record = None
    if view is None or (view.model, view.dimensions) == wanted:
        return Decision(None, abandoned)
    try:
        served_model = get_model(catalogue(job.opts), view.model)
    except ConfigError as exc:
        raise UsageError(f"--output {out.path} serves {view.model}, which the model catalogue no longer has "
                         f"({exc}): its view cannot be kept current during a switch; write {job.model.name} "
                         "to another --output, with --known to reuse what is paid") from None
    if record is None:
        record = Switch.start(view, *wanted)
        if act:
            switches.save(out, record)
    return Decision(Switching(job.for_model(served_model, view.dimensions), job.next_run(), record), abandoned)

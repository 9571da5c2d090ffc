"""`run`: check, read the account, run the Beam job, commit DIR's new view, reconcile, write
summary.json.

One path for every run: a first run, a retry, a resume after a kill or a budget stop, the
next day's run on a changed corpus. What differs is only what DIR's current view holds
(pipeline/checks/prior.py) and whether documents the input no longer has leave it (--sync).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc

from pipeline import graph
from pipeline.checks.inputs import inspect_input
from pipeline.checks.prior import Prior, pending_input, prior, removed
from pipeline.checks.scan import scan_input, scan_pending
from pipeline.commands import summary
from pipeline.exits import JobFailed
from pipeline.money import account as acct
from pipeline.money import measure
from pipeline.outdir import OutputDir, late, layout
from pipeline.outdir.commit import RunFiles
from pipeline.outdir.view import View
from pipeline.runner import counters, make_runner
from pipeline.settings.job import RESUME, Job
from pipeline.terminal.progress import job_progress
from service import errors
from service.client import EmbeddingsClient
from transforms.money import journal
from transforms.money.budget import Budget
from transforms.worker import progress
from transforms.write.rewrite import RewriteFiles

log = logging.getLogger("embedpipe")


def client_for(job: Job) -> EmbeddingsClient:
    """The driver's client: the account before and after, never embeddings."""
    return job.service.client(pool_size=2)


def _account_after(job: Job) -> acct.Account:
    """Best effort: a key revoked mid-run must not cost the run its summary."""
    try:
        with client_for(job) as client:
            return acct.read_account(client)
    except errors.EmbeddingsError as exc:
        log.warning("could not read the account after the run (%s); summary.json has no balance_after",
                    exc.message)
        return acct.Account(None, None, None)


def execute(job: Job) -> tuple[int, dict]:
    started = dt.datetime.now(dt.timezone.utc)
    out = OutputDir(job.opts.output)
    out.check_writable()
    with out.lock(job.run_id, job.settings.lock):
        out.adopt_earlier_layout()
        out.repair_link()
        return _execute(job, out, started)


def _template(job: Job, before: Prior, info) -> View:
    """The view's identity: --resume alone keeps the view's signature and kept columns."""
    if not job.opts.input and before.view is not None:
        return before.view
    return View("", job.model.name, job.dimensions, job.signature.hex(), tuple(f.name for f in info.kept_fields),
                {})


def _run_job(job: Job, out: OutputDir, info, before: Prior, scan, budget: Budget) -> dict[str, int]:
    opts = job.opts
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    with graph.claims_for(job, job.run_id) as claiming:
        graph.build(pipeline, job, info, before, out.make_run_dir(job.run_id),
                    duplicate_ids=scan.duplicate_ids, claiming=claiming, budget=budget)
        try:
            with job_progress(opts.output, job.run_id, scan.rows, budget.spendable.rub,
                              job.settings.embed.progress_interval_s):
                result = pipeline.run()
                result.wait_until_finish()
        except Exception as exc:  # a worker's error arrives wrapped by the runner
            last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise JobFailed(f"the job failed on a worker: {last}. What was paid for is journaled in "
                            f"{journal.journal_dir(opts.output, job.run_id)}; fix the cause and run "
                            f"{job.again}: nothing is paid twice.") from None
        late.write_late_copies(out, job.run_id, claiming.late(), job.keep_columns, job.codec)
    return counters(result)


def _rewriter(job: Job):
    """Files of the view whose rows change are rewritten by a Beam job on the run's runner
    (on Dataflow its workers, not the launcher, read and write them)."""
    def rewrite(tasks, rules_path: str) -> None:
        p = beam.Pipeline(runner=make_runner(job.opts), options=job.opts)
        p | "Tasks" >> beam.Create(tasks) | "Rewrite" >> RewriteFiles(rules_path, job.codec)
        p.run().wait_until_finish()
    return rewrite


def _run_files(out: OutputDir, run_id: str) -> dict[str, list[str]]:
    kinds = ("changes",) + layout.READER_KINDS
    return {kind: [out.relative(p) for p in out.history_files(kind, run_id)] for kind in kinds}


def _execute(job: Job, out: OutputDir, started: dt.datetime) -> tuple[int, dict]:
    opts, s = job.opts, job.settings
    before = prior(job, out)
    info = (inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns) if opts.input
            else pending_input(before))
    scan = scan_input(info, opts.id_column, opts.text_column) if opts.input else scan_pending(info.files)
    missing = removed(before, scan.ids) if opts.input else pa.array([], pa.string())
    gone = pa.array([], pa.string()) if job.mode == RESUME else missing   # --resume keeps them
    with client_for(job) as client:
        account = acct.read_account(client, need_stats=bool(job.caps.by_name()))
    out.record_start(job.run_id, job.model.name, job.mode, account.as_dict())
    spendable = acct.spendable(account, s.budget.reserve_rub, opts.max_spend_rub, job.caps)
    learned = out.learned_price(job.model.name)
    price = learned if learned is not None else job.model.price_per_token
    margin = job.initial_margin(learned is not None)
    log.info("run %s (%s, %s): %d rows; spendable %.6f RUB of balance %.6f (%s binds)", job.run_id, job.mode,
             job.model.name, info.rows, spendable.rub, account.balance or 0, spendable.binding)
    fits, decided_by = ((True, "allow_partial") if opts.allow_partial
                        else measure.fits(job, info, before, scan, spendable.rub, price, margin))
    budget = Budget(account.balance, spendable, price, margin, 1 / job.model.safety_factor,
                    s.budget.balance_poll_s, fits)
    metrics = _run_job(job, out, info, before, scan, budget)
    requests = tuple(out.relative(p) for p in out.history_files("requests"))   # a killed run's too
    view = out.commit(RunFiles(job.run_id, _run_files(out, job.run_id), bool(opts.input), gone, requests),
                      before.view, _template(job, before, info), job.codec, _rewriter(job))
    after = _account_after(job)
    report = summary.build_summary(
        out, view, run_id=job.run_id, model=job.model.name, metrics=metrics, removed=len(gone),
        input_ids=len(pc.drop_null(scan.ids)) if opts.input else None,
        account_before=account.as_dict(), account_after=after.as_dict(),
        estimate={"price_rub_per_1m_tokens": price * 1e6, "spendable_rub": spendable.rub, "preflight": decided_by},
        catalogue_price=job.model.price_per_token,
        caps={**dataclasses.asdict(job.caps), "binding_limit": spendable.binding}, started=started)
    out.write_summary(report)
    out.record_finish(job.run_id, after.as_dict(), report["reconciliation"]["unanswered"])
    journal.discard(opts.output, job.run_id)
    progress.discard(opts.output, job.run_id)
    out.collect_garbage(s.views.keep)
    if len(missing) and not len(gone):
        log.info("%d documents of %s are not in this input and stay current (--resume); pass --sync when the "
                 "input is the whole corpus", len(missing), opts.output)
    return report["exit_code"], report

"""`run`: validate, read the account, run the Beam job, reconcile, write summary.json."""
from __future__ import annotations

import logging

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from pipeline import account as acct
from pipeline import graph, history, summary
from pipeline.lock import OutputLock
from pipeline.inputs import check_output_writable, inspect_input
from pipeline.job import Job
from pipeline.resume import check_fresh_output, known_sources, learned_price, pending_input
from service import errors
from service.client import EmbeddingsClient
from transforms import journal

log = logging.getLogger("embedpipe")


class JobFailed(Exception):
    """The Beam job itself failed (exit 1); the message says what to do."""


def make_runner(opts):
    """The DirectRunner would first try to download Prism; FnApiRunner runs the same pipeline
    locally (honouring --direct_num_workers and --direct_running_mode) with nothing fetched."""
    name = opts.view_as(StandardOptions).runner
    return FnApiRunner() if name in (None, "DirectRunner", "FnApiRunner") else None


def client_for(job: Job) -> EmbeddingsClient:
    s = job.settings.client
    return EmbeddingsClient(job.opts.base_url, job.key_source.load(), account_segment=job.opts.account_segment,
                            retry=job.retry, pool_size=2, encoding_format=s.encoding_format)


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
    check_output_writable(job.opts.output)
    with OutputLock(job.opts.output, job.run_id, job.settings.lock):
        return _execute(job)


def _execute(job: Job) -> tuple[int, dict]:
    opts = job.opts
    check_fresh_output(job)
    info = (inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns) if opts.input
            else pending_input(job)[0])
    known = known_sources(job)
    with client_for(job) as client:
        before = acct.read_account(client)
    history.record_start(opts.output, job.run_id, job.model.name, opts.resume, before.as_dict())
    spendable = acct.spendable(before, job.settings.budget.reserve_rub, opts.max_spend_rub)
    learned = learned_price(opts.output)
    price = learned if learned is not None else job.model.price_per_token
    log.info("run %s: %d files, %d rows, model %s; balance %.6f RUB, spendable %.6f RUB",
             job.run_id, len(info.files), info.rows, job.model.name, before.balance or 0, spendable)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    graph.build(pipeline, job, info, known, balance_before=before.balance, spendable_rub=spendable,
                price_per_token_rub=price, margin=job.initial_margin(learned is not None))
    try:
        result = pipeline.run()
        result.wait_until_finish()
    except Exception as exc:  # a worker's error arrives wrapped by the runner
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise JobFailed(f"the job failed on a worker: {last}. What was paid for is journaled in "
                        f"{journal.journal_dir(opts.output, job.run_id)}; fix the cause and run "
                        "again with --resume.") from None
    after = _account_after(job)
    metrics = counters(result)
    report = summary.build_summary(
        output_dir=opts.output, run_id=job.run_id, model=job.model.name,
        documents=metrics.get("documents", 0), account_before=before.as_dict(),
        account_after=after.as_dict(),
        estimate={"price_rub_per_1m_tokens": price * 1e6, "spendable_rub": spendable}, metrics=metrics,
        catalogue_price=job.model.price_per_token, carried_files=known.carried_files)
    summary.write_summary(opts.output, report)
    history.record_finish(opts.output, job.run_id, after.as_dict(), report["reconciliation"]["unanswered"])
    journal.discard(opts.output, job.run_id)
    return report["exit_code"], report

"""`run`: validate, read the account, run the Beam job, reconcile, write summary.json."""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging

import apache_beam as beam
import pyarrow.compute as pc

from pipeline import account as acct
from pipeline import graph, history, late, measure, summary
from pipeline.lock import OutputLock
from pipeline.inputs import check_output_writable, inspect_input
from pipeline.job import Job
from pipeline.resume import check_fresh_output, known_sources, learned_price, pending_input
from pipeline.runner import counters, make_runner
from pipeline.scan import scan_input, scan_pending
from pipeline.watch import progress_lines
from service import errors
from service.client import EmbeddingsClient
from transforms import journal, progress, runscoped

log = logging.getLogger("embedpipe")


class JobFailed(Exception):
    """The Beam job itself failed (exit 1); the message says what to do."""


def client_for(job: Job) -> EmbeddingsClient:
    s = job.settings.client
    return EmbeddingsClient(job.opts.base_url, job.key_source.load(), account_segment=job.opts.account_segment,
                            retry=job.retry, pool_size=2, encoding_format=s.encoding_format)


def _account_after(job: Job) -> acct.Account:
    """Best effort: a key revoked mid-run must not cost the run its summary."""
    try:
        with client_for(job) as client:
            return acct.read_account(client)
    except errors.EmbeddingsError as exc:
        log.warning("could not read the account after the run (%s); summary.json has no balance_after",
                    exc.message)
        return acct.Account(None, None, None)


def _timing(output_dir: str, run_id: str, started: dt.datetime) -> dict:
    """When the job started and when its first request left (streaming: within seconds)."""
    tables = summary.read_columns(summary.run_files(output_dir, "requests", run_id), ["started_at", "run_id"])
    firsts = [pc.min(t.filter(pc.equal(t.column("run_id"), run_id)).column("started_at")).as_py() for t in tables]
    first = min((f for f in firsts if f is not None), default=None)
    return {"started_at": started.isoformat(), "first_request_at": first and first.isoformat(),
            "seconds_to_first_request": first and round((first - started).total_seconds(), 3)}


def execute(job: Job) -> tuple[int, dict]:
    started = dt.datetime.now(dt.timezone.utc)
    check_output_writable(job.opts.output)
    with OutputLock(job.opts.output, job.run_id, job.settings.lock):
        return _execute(job, started)


def _execute(job: Job, started: dt.datetime) -> tuple[int, dict]:
    opts, s = job.opts, job.settings
    check_fresh_output(job)
    info = (inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns) if opts.input
            else pending_input(job)[0])
    scan = (scan_input(info, opts.id_column, opts.text_column) if opts.input else scan_pending(info.files))
    known = known_sources(job)
    with client_for(job) as client:
        before = acct.read_account(client, need_stats=bool(job.caps.by_name()))
    history.record_start(opts.output, job.run_id, job.model.name, opts.resume, before.as_dict())
    spendable = acct.spendable(before, s.budget.reserve_rub, opts.max_spend_rub, job.caps)
    learned = learned_price(opts.output)
    price = learned if learned is not None else job.model.price_per_token
    margin = job.initial_margin(learned is not None)
    log.info("run %s: %d files, %d rows, model %s; balance %.6f RUB, spendable %.6f RUB (%s binds)",
             job.run_id, len(info.files), info.rows, job.model.name, before.balance or 0, spendable,
             spendable.binding)
    fits, decided_by = ((True, "allow_partial") if opts.allow_partial
                        else measure.fits(job, info, known, scan, spendable, price, margin))
    streaming = graph.streams(job)
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    graph.build(pipeline, job, info, known, duplicate_ids=scan.duplicate_ids, streaming=streaming, fits=fits,
                balance_before=before.balance, spendable_rub=spendable, price_per_token_rub=price, margin=margin)
    try:
        with progress_lines(opts.output, job.run_id, scan.rows, s.embed.progress_interval_s):
            result = pipeline.run()
            result.wait_until_finish()
    except Exception as exc:  # a worker's error arrives wrapped by the runner
        last = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise JobFailed(f"the job failed on a worker: {last}. What was paid for is journaled in "
                        f"{journal.journal_dir(opts.output, job.run_id)}; fix the cause and run "
                        "again with --resume.") from None
    finally:
        claims = runscoped.discard(job.run_id).get("claims")
    if claims is not None:
        late.write_late_copies(opts.output, job.run_id, claims.late, job.keep_columns, s.write.codec)
    after = _account_after(job)
    metrics = counters(result)
    report = summary.build_summary(
        output_dir=opts.output, run_id=job.run_id, model=job.model.name,
        documents=metrics.get("documents", 0), account_before=before.as_dict(),
        account_after=after.as_dict(),
        estimate={"price_rub_per_1m_tokens": price * 1e6, "spendable_rub": spendable, "preflight": decided_by},
        metrics=metrics, catalogue_price=job.model.price_per_token, carried_files=known.carried_files,
        caps={**dataclasses.asdict(job.caps), "binding_limit": spendable.binding})
    report["timing"] = _timing(opts.output, job.run_id, started)
    summary.write_summary(opts.output, report)
    history.record_finish(opts.output, job.run_id, after.as_dict(), report["reconciliation"]["unanswered"])
    journal.discard(opts.output, job.run_id)
    progress.discard(opts.output, job.run_id)
    return report["exit_code"], report

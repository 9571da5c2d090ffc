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
import time
from collections.abc import Callable

import apache_beam as beam
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline import graph
from pipeline.checks import reading, switching, workers
from pipeline.checks.inputs import InputInfo, inspect_input
from pipeline.checks.prior import Prior, check_kept, pending_input, prior, removed
from pipeline.checks.nul import warn_nul
from pipeline.checks.scan import Scan, scan_input, scan_pending
from pipeline.commands import summary
from pipeline.exits import EXIT_FAILED, EXIT_OK, EXIT_PARTIAL, JobFailed, RunnerLost, UsageError
from pipeline.money import account as acct
from pipeline.money import measure
from pipeline.outdir import OutputDir, kept, late, layout, space
from pipeline.outdir import switch as switches
from pipeline.outdir.commit import RunFiles, rewrites_at_most
from pipeline.outdir.view import View
from pipeline.runner import counters, described, make_runner
from pipeline.settings.job import RESUME, Job, catalogue
from pipeline.terminal import hints
from pipeline.terminal.progress import job_progress
from service import errors
from service.catalog import get_model
from service.client import EmbeddingsClient
from transforms.errors import one_line
from transforms.money import journal
from transforms.money.budget import Budget
from transforms.money.caps import Spendable
from transforms.read.changes import REWRITTEN
from transforms.read.parquet import read_tables
from transforms.read.stamps import InputChanged
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
    except (errors.EmbeddingsError, UsageError) as exc:
        log.warning("could not read the account after the run (%s); summary.json has no balance_after",
                    getattr(exc, "message", exc))
        return acct.Account(None, None, None)


def execute(job: Job, then: Callable[[int, dict], int] | None = None) -> tuple[int, dict]:
    """The run: (exit code, summary). THEN(code, summary) -> code follows the commit while the
    run still holds DIR's lock (`run --publish`: the view it publishes is the one this run
    committed, and the summary it completes is this run's)."""
    started = dt.datetime.now(dt.UTC)
    out = OutputDir(job.opts.output)
    space.quiet_worker_logs()
    writes = _Writes()
    try:
        out.check_writable()
        with out.lock(job.run_id, job.settings.lock):
            out.adopt_earlier_layout()
            out.repair_link()
            out.collect_garbage(job.settings.views.keep)   # a killed commit's files: room for this one
            code, report = _execute(job, out, started, writes)
            return (then(code, report) if then else code), report
    except JobFailed:
        raise
    except Exception as exc:   # anywhere in DIR: the probe, the lock, a record, the job, the commit
        if not space.is_full(exc):
            raise
        raise _disk_full(job, writes, exc) from None


@dataclasses.dataclass
class _Writes:
    """What the command writes into DIR, for a full disk's message: its parts (once read),
    the runs whose job finished (their rows are on disk) and the parts committed."""
    parts: list[_Part] = dataclasses.field(default_factory=list)
    finished: set[str] = dataclasses.field(default_factory=set)
    committed: set[str] = dataclasses.field(default_factory=set)


def _rows_at_most(part: _Part) -> int:
    """At most a chunk per document and per window of its tokens, each vector written twice
    (the journal, then the history) with room for its other columns."""
    chunks = part.scan.rows + part.scan.tokens_bound // part.job.chunking.chunk_tokens
    return 2 * chunks * (4 * part.job.dimensions + 256)


def _rows_written(part: _Part) -> int:
    """What the part's finished job wrote (its history, its journal): the same command writes it again."""
    run_id = part.job.run_id
    found = FileSystems.match([part.out.join(f"{layout.run_dir(run_id)}/*"),
                               journal.journal_dir(part.out.path, run_id) + "/*"])
    return sum(m.size_in_bytes for r in found for m in r.metadata_list)


def _disk_full(job: Job, writes: _Writes, exc: BaseException, failed: OutputDir | None = None) -> JobFailed:
    """The line for a full disk met by JOB (in FAILED's part, when known). What the same
    command writes again: each part not committed, its rows (measured once its job finished)
    and the view's files its commit writes again (as the failed commit counted them, else all
    it may)."""
    commit = space.known_needs(exc)
    rows = rewrites = 0
    for part in (p for p in writes.parts if p.job.run_id not in writes.committed):
        done = part.job.run_id in writes.finished
        rows += _rows_written(part) if done else _rows_at_most(part)
        rewrites += commit if done and commit is not None else rewrites_at_most(part.out.path, part.before.view)
    needs = space.Needs(rows, rewrites) if writes.parts else None
    served = space.SERVED if failed is None or failed.slot != layout.TARGET else _served_beside(failed, job)
    if (other := space.other_disk(exc, job.opts.output, needs)) is not None:
        return JobFailed(space.elsewhere(other, job.opts.output, job.again, served))
    return JobFailed(space.message(job.opts.output, needs, job.again, served))


def _served_beside(target: OutputDir, job: Job) -> str:
    """What DIR serves when a switch's target part failed: the served view's part of this run
    came first, and is committed."""
    served = OutputDir(target.path).view
    assert served is not None  # a switch starts from a served view
    return (f"{target.path} serves this run's changes, committed in its view of {served.model}; "
            f"the view of {job.model.name} beside it stays as it was before this run")


def _kept(out: OutputDir, job: Job) -> str:
    """What DIR serves after JOB's part (in OUT's slot) failed before its commit."""
    if out.slot == layout.TARGET:
        return _served_beside(out, job)
    return f"nothing is committed: {out.path} serves the view it had before this run"


def _template(job: Job, before: Prior, info) -> View:
    """The view's identity: --resume alone keeps the view's signature and kept columns."""
    if not job.opts.input and before.view is not None:
        return dataclasses.replace(before.view, kept_types=kept.encode(info.kept_fields))
    return View("", job.model.name, job.dimensions, job.signature.hex(), tuple(f.name for f in info.kept_fields),
                {}, kept_types=kept.encode(info.kept_fields), chunking=job.chunking)


def _run_job(job: Job, out: OutputDir, info, before: Prior, scan, budget: Budget) -> tuple[dict[str, int], dict]:
    """The part's Beam job (OUT: its slot): (its counters, its figures: summary.run_figures);
    a full disk is raised as it came, for the caller to count."""
    opts = job.opts
    pipeline = beam.Pipeline(runner=make_runner(opts), options=opts)
    with graph.claims_for(job, job.run_id) as claiming:
        graph.build(pipeline, job, info, before, out.make_run_dir(job.run_id),
                    duplicate_ids=scan.duplicate_ids, claiming=claiming, budget=budget)
        with job_progress(opts.output, job.run_id, scan.rows if opts.input else 0, budget.spendable.rub,
                          job.settings.embed, paced=claiming.streaming) as ending:
            try:
                result = pipeline.run()
                result.wait_until_finish()
            except Exception as exc:  # a worker's error arrives wrapped by the runner
                if space.is_full(exc):
                    raise
                raise _failed(job, out, info, exc) from None
            late.write_late_copies(out, job.run_id, claiming.late(), job.keep_columns, job.codec)
            metrics, figures = counters(result), summary.run_figures(out, job.run_id)
            ending(metrics.get("documents", 0), figures)
    return metrics, figures


# an attempt that timed out may have been billed without an answer: only what was answered is known paid
NOT_TWICE = "nothing answered is paid twice"


def _failed(job: Job, out: OutputDir, info: InputInfo, exc: Exception) -> JobFailed:
    """A job that failed on a worker, as one line; an input file that changed or cannot be read is named."""
    if (changed := reading.changed(info)) is not None:
        return _changed(job, out, changed)
    if (where := workers.message(job, exc)) is not None:   # the workers or the runner, not the data
        return RunnerLost(where) if workers.runner_gone(exc) else JobFailed(where)
    paid = f"What was paid for is journaled in {journal.journal_dir(job.opts.output, job.run_id)}"
    if (reason := reading.unreadable(exc)) is not None:
        return JobFailed(f"{reason}; {_kept(out, job)}. {paid}; replace the file with a readable copy and run "
                         f"{job.again}: {NOT_TWICE}.")
    return JobFailed(f"the job failed on a worker: {one_line(exc, worker=True)} (--verbose shows where). {paid}; "
                     f"fix the cause and run {job.again}: {NOT_TWICE}.")


def _changed(job: Job, out: OutputDir, changed: InputChanged) -> JobFailed:
    return JobFailed(f"{changed}; {_kept(out, job)}. What was paid for is kept in {job.opts.output}; once the "
                     f"input is written whole, run {job.again}: {NOT_TWICE}.")


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


@dataclasses.dataclass(frozen=True)
class _Part:
    """One model's share of a run against one slot of DIR (a switch has two: the served view's
    model, then the target's)."""
    job: Job
    out: OutputDir
    before: Prior
    info: InputInfo
    scan: Scan
    missing: pa.Array           # the view's documents the input does not have
    gone: pa.Array              # those that leave it (--resume keeps them)
    price: float
    margin: float

    @property
    def measure(self) -> measure.Part:
        return measure.Part(self.job, self.info, self.before, self.scan, self.price, self.margin)


def _part(job: Job, out: OutputDir, info: InputInfo | None = None, scan: Scan | None = None) -> _Part:
    opts = job.opts
    before = prior(job, out)
    if info is None or scan is None:   # given together
        info = check_kept(job, out, inspect_input(opts.input, opts.id_column, opts.text_column, job.keep_columns)
                          if opts.input else pending_input(before, out))
        scan = scan_input(info, opts.id_column, opts.text_column) if opts.input else scan_pending(info.files)
        if opts.input:
            warn_nul(info, opts.id_column, opts.text_column, job.chunk_text)
    else:   # a switch's target: the day's input, against the target's view
        info = check_kept(job, out, info)
    missing = removed(before, scan.ids) if opts.input else pa.array([], pa.string())
    gone = pa.array([], pa.string()) if job.mode == RESUME else missing
    learned = out.learned_price(job.model.name)
    price = learned if learned is not None else job.model.price_per_token
    return _Part(job, out, before, info, scan, missing, gone, price, job.initial_margin(learned is not None))


def _run_part(part: _Part, account: acct.Account, spendable: Spendable, fits: bool,
              writes: _Writes) -> tuple[dict[str, int], dict, float]:
    """PART's job, then its slot's next view: (the job's counters, its figures, seconds the commit took)."""
    job, out, s = part.job, part.out, part.job.settings
    out.record_start(job.run_id, job.model.name, job.mode, account.as_dict(), hints.remembered(job.service.base_url),
                     job.chunking._asdict())
    budget = Budget(account.balance, spendable, part.price, part.margin, 1 / job.model.safety_factor,
                    s.budget.balance_poll_s, fits)
    metrics, figures = _run_job(job, out, part.info, part.before, part.scan, budget)
    writes.finished.add(job.run_id)
    if (changed := reading.changed(part.info)) is not None:   # what the job read may be mixed: never served
        raise _changed(job, out, changed)
    committing = time.monotonic()
    requests = tuple(out.relative(p) for p in out.history_files("requests"))   # a killed run's too
    out.commit(RunFiles(job.run_id, _run_files(out, job.run_id), bool(job.opts.input), part.gone, requests,
                        job.chunk_text),
               part.before.view, _template(job, part.before, part.info), job.codec, _rewriter(job))
    writes.committed.add(job.run_id)
    return metrics, figures, round(time.monotonic() - committing, 3)


def _read_account(job: Job) -> acct.Account:
    with client_for(job) as client:
        return acct.read_account(client, need_stats=bool(job.caps.by_name()))


def _spendable(job: Job, account: acct.Account, spent_rub: float = 0.0) -> Spendable:
    """What may be spent now; SPENT_RUB, what this command spent already (--max-spend-rub is per command)."""
    cap = job.opts.max_spend_rub
    return acct.spendable(account, job.settings.budget.reserve_rub, None if cap is None else max(0.0, cap - spent_rub),
                          job.caps)


def _advance(out: OutputDir, target: _Part, record: switches.Switch, spent: float, ids: pa.Array,
             writes: _Writes) -> tuple[bool, float]:
    """The switch's share of the run, with what the served view's share left (SPENT: what it
    spent): the target's view, and the switch of OUT's current view when it holds the whole
    corpus of the day (IDS). (switched, seconds of the target's commit and the switch)."""
    account = _read_account(target.job)
    switches.add_run(out, record, target.job.run_id)
    log.info("switch to %s: building its view beside the served one with what is left", target.job.model.name)
    _, _, commit_s = _run_part(target, account, _spendable(target.job, account, spent), True, writes)
    switching_at = time.monotonic()
    complete = switches.covers(out, ids)
    if complete:
        switches.promote(out)
        log.info("switched %s to %s: current/ serves it now", out.path, target.job.model.name)
    return complete, round(commit_s + time.monotonic() - switching_at, 3)


def _execute(job: Job, out: OutputDir, started: dt.datetime, writes: _Writes) -> tuple[int, dict]:
    opts, s = job.opts, job.settings
    decision = switching.decide(job, out, act=True)
    served = _part(decision.switching.served if decision.switching else job, out)
    writes.parts.append(served)
    account = _read_account(job)
    spendable = _spendable(job, account)
    log.info("run %s (%s, %s): %d rows; spendable %.6f RUB of balance %.6f (%s binds)", job.run_id, job.mode,
             served.job.model.name, served.info.rows, spendable.rub, account.balance or 0, spendable.binding)
    target = (_part(decision.switching.target, out.target(), served.info, served.scan) if decision.switching
              else None)
    writes.parts += [target] if target else []
    # a switch's target fits with --allow-partial, or when the whole of it fits beside the day's changes
    parts = [p.measure for p in (served, target) if p]
    fits, decided_by = (True, "allow_partial") if opts.allow_partial else measure.fits(parts, spendable.rub)
    metrics, served_figures, commit_s = _run_part(served, account, spendable, fits, writes)
    switched, target_commit_s, stopped = False, None, False
    if target and served_figures["exit_code"] != EXIT_OK:
        target = None   # the served view's share stopped: nothing is left for the target
    if target and decision.switching:
        try:
            switched, target_commit_s = _advance(out, target, decision.switching.record, served_figures["cost_rub"],
                                                 pc.drop_null(served.scan.ids), writes)
        except Exception as exc:   # the served view is committed: report it
            if space.is_full(exc):
                exc = _disk_full(target.job, writes, exc, target.out)
            elif not isinstance(exc, (JobFailed, errors.EmbeddingsError)):
                raise
            log.error("the switch to %s did not advance: %s", job.model.name, getattr(exc, "message", exc))
            target, stopped = None, True
    after = _account_after(job)
    others = (target.job.run_id,) if target else ()
    assert out.view is not None   # committed by _run_part
    report = summary.build_summary(
        out, out.view, run_id=job.run_id, model=served.job.model.name, metrics=metrics, removed=len(served.gone),
        input_ids=len(pc.drop_null(served.scan.ids)) if opts.input else None,
        account_before=account.as_dict(), account_after=after.as_dict(),
        estimate={"price_rub_per_1m_tokens": served.price * 1e6, "spendable_rub": spendable.rub,
                  "preflight": decided_by},
        catalogue={name: m.price_per_token for name, m in catalogue(job.opts).items()},
        caps={**dataclasses.asdict(job.caps), "binding_limit": spendable.binding}, started=started,
        other_runs=others)
    report["timing"]["commit_s"] = commit_s
    report["runner"] = described(opts)
    report.update(_switch_report(decision, out, served, target, switched, stopped))
    if target is not None:
        report["switch"]["run"]["commit_s"] = target_commit_s   # its view's commit, and the switch
    out.write_summary(report)
    if report["changes"].get(REWRITTEN):
        log.info(_rewritten(out, served.job, report["changes"][REWRITTEN], served.before.view))
    for run_id in (job.run_id, *others):
        out.record_finish(run_id, after.as_dict(),
                          [u for u in report["reconciliation"]["unanswered"] if u["run_id"] == run_id])
        journal.discard(opts.output, run_id)
        progress.discard(opts.output, run_id)
    out.collect_garbage(s.views.keep)
    out.remove_leftovers({job.run_id, *((decision.switching.target.run_id,) if decision.switching else ())})
    if len(served.missing) and not len(served.gone):
        log.info("%d documents of %s are not in this input and stay current (--resume); pass --sync when the "
                 "input is the whole corpus", len(served.missing), opts.output)
    return report["exit_code"], report


def _rewritten(out: OutputDir, job: Job, documents: int, previous: View | None) -> str:
    """One line on the documents whose rows this run wrote again only to add their text (or
    leave it out), after PREVIOUS: a view written without it (a manifest that records its files
    without text), or before rows carried it (one that does not)."""
    changes = pa.concat_tables(read_tables(out.history_files("changes", job.run_id), ["doc_id", "change"]))
    ids = changes.filter(pc.equal(changes.column("change"), REWRITTEN)).column("doc_id").combine_chunks()
    rows = sum(pc.sum(pc.is_in(t.column("doc_id"), value_set=ids)).as_py() or 0
               for t in read_tables(out.history_files("embeddings", job.run_id), ["doc_id"]))
    what = f"{rows:,} rows of {documents:,} unchanged documents"
    if job.chunk_text:
        why = ("rows written with --no-chunk-text or output.chunk_text: false" if previous and
               previous.textless is not None else "rows written before rows carried it")
        return f"gave {what} their text, their vectors reused ({why})"
    setting = "--no-chunk-text" if job.opts.no_chunk_text else "output.chunk_text: false"
    return f"left the text out of {what}, their vectors reused ({setting})"


def _price_of(out: OutputDir, job: Job, model: str) -> float:
    """RUB per token of MODEL, as billed in DIR's history, else the catalogue's."""
    learned = out.learned_price(model)
    return learned if learned is not None else get_model(catalogue(job.opts), model).price_per_token


def _switch_report(decision: switching.Decision, out: OutputDir, served: _Part, target: _Part | None,
                   switched: bool, stopped: bool) -> dict:
    """summary.json's `switch` (while one is under way, or ended by this run) and the exit code:
    a switch that is not complete is a partial run (4); its target's own failure (or STOPPED:
    its job failed) is the run's (1)."""
    if switched:   # its record is gone with the switch
        assert decision.switching is not None and target is not None   # a switch's target advanced
        record: switches.Switch | None = dataclasses.replace(decision.switching.record,
                                                             runs=decision.switching.record.runs + (target.job.run_id,))
    else:
        record = switches.load(out)
    if record is None:
        return {"switch": {"abandoned": decision.abandoned}} if decision.abandoned else {}
    ids = pc.drop_null(served.scan.ids) if served.job.opts.input else None
    price = target.price if target else _price_of(out, served.job, record.to_model)
    status = switches.status(out, record, ids, price, switched)
    status["abandoned"] = decision.abandoned
    report: dict = {"switch": status}
    if target is not None:
        figures = summary.run_figures(out, target.job.run_id)
        figures.pop("_own_requests")
        status["run"] = figures
        report["exit_code"] = figures["exit_code"] or (EXIT_OK if switched else EXIT_PARTIAL)
    elif decision.switching:
        report["exit_code"] = EXIT_FAILED if stopped else (summary.run_figures(out, served.job.run_id)["exit_code"]
                                                            or EXIT_PARTIAL)
    return report

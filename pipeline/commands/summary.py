"""summary.json: what this run did and changed, what DIR's current view holds now, the
reconciliation over DIR's whole history (pipeline/money/reconcile.py) and the files of the view.

Built from the output files themselves (the durable truth), not from in-memory counters.
"""
from __future__ import annotations

import collections
import datetime as dt
import os
import time
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.money.reconcile import reconcile
from pipeline.outdir import OutputDir
from pipeline.outdir.view import View, rows_without_text
from transforms.money import journal
from transforms.money.apportion import from_micro, to_micro
from transforms.pending import exit_code
from transforms.read.changes import counts
from transforms.read.parquet import read_tables


def _sum_micro(tables, column: str) -> int:
    return sum(to_micro(v) for t in tables for v in t.column(column).to_pylist() if v is not None)


REQUEST_COLUMNS = ["request_id", "model", "total_tokens", "cost_rub", "balance_after", "attempts", "latency_ms",
                   "status", "started_at", "run_id"]


def _all_requests(out: OutputDir) -> list[dict]:
    """Every request row in DIR: the history's requests files, then journaled ones not written yet."""
    rows = {r["request_id"]: r for t in read_tables(out.history_files("requests"), REQUEST_COLUMNS)
            for r in t.to_pylist()}
    for r in journal.read_requests(out.path, skip=set(rows)):
        rows[r["request_id"]] = r
    return list(rows.values())


def _micro_by_request(tables) -> dict[str, int]:
    """Σ micro-roubles of the rows of each request (one entry a request, not a row)."""
    if not tables:
        return {}
    rows = pa.concat_tables(tables, promote_options="default")
    micro = pc.cast(pc.round(pc.multiply(pc.fill_null(rows.column("cost_rub"), 0.0), 1e6)), pa.int64())
    sums = pa.table({"request_id": rows.column("request_id"), "micro": micro}).group_by("request_id").aggregate(
        [("micro", "sum")])
    return dict(zip(sums.column("request_id").to_pylist(), sums.column("micro_sum").to_pylist(), strict=True))


def _reasons(tables) -> dict[str, int]:
    counts: collections.Counter[str] = collections.Counter()
    for t in tables:
        counts.update(t.column("reason").to_pylist())
    return dict(sorted(counts.items()))


def _changes(out: OutputDir, run_id: str, documents: int | None, removed: int) -> dict:
    """Documents added, edited, removed, unchanged, and resumed (the version DIR was building:
    its pending chunks sent now), against the view before this run."""
    tables = read_tables(out.history_files("changes", run_id), ["doc_id", "change"])
    changed = {}
    if tables:
        distinct = pa.concat_tables(tables).group_by(["change", "doc_id"]).aggregate([])
        per_change = distinct.group_by("change").aggregate([("doc_id", "count")])
        changed = dict(zip(per_change.column("change").to_pylist(), per_change.column("doc_id_count").to_pylist(), strict=True))
    return counts(changed, documents, removed)


def _current(out: OutputDir, view: View) -> dict:
    """What the view holds: documents (with an id, plus rows without one), and rows; of its
    embeddings rows, those without their chunk's text (without_text)."""
    no_id = sum(pc.sum(pc.is_null(t.column("doc_id"))).as_py() or 0
                for t in read_tables([out.join(p) for p in view.paths("failed")], ["doc_id"]))
    embedded, failed, pending = (view.rows(k) for k in ("embeddings", "failed", "pending"))
    return {"view": view.view, "documents": view.documents + no_id, "chunks": embedded + failed + pending,
            "embedded": embedded, "failed": failed, "pending": pending,
            "staged": view.rows("staged-embeddings") + view.rows("staged-failed"),
            "without_text": rows_without_text(out.path, view)}


def process_started_at() -> dt.datetime | None:
    """When this process started, imports included (Linux: its start in clock ticks since boot,
    against the clock since boot now); None where the system does not say."""
    try:
        with open("/proc/self/stat", encoding="ascii") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        since_boot = time.clock_gettime(time.CLOCK_BOOTTIME)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
    return dt.datetime.fromtimestamp(time.time() - since_boot + ticks / os.sysconf("SC_CLK_TCK"), dt.UTC)


def _timing(requests: list, started: dt.datetime) -> dict:
    """When the job started (after the imports) and when its first request left (streaming:
    within seconds), also counted from the process start where the system says when that was."""
    firsts = [pc.min(t.column("started_at")).as_py() for t in requests if t.num_rows]
    first = min((f for f in firsts if f is not None), default=None)
    process = process_started_at()
    return {"started_at": started.isoformat(), "first_request_at": first and first.isoformat(),
            "seconds_to_first_request": first and round((first - started).total_seconds(), 3),
            "process_started_at": process and process.isoformat(),
            "seconds_from_process_start_to_first_request": first and process and
            round((first - process).total_seconds(), 3)}


def run_figures(out: OutputDir, run_id: str) -> dict:
    """What RUN_ID's job did, from the files it wrote: rows, requests, money, its exit code."""
    def mine(kind: str, columns: list[str]):
        return read_tables(out.history_files(kind, run_id), columns)

    emb = mine("embeddings", ["cost_rub", "request_id"])
    req = mine("requests", ["request_id", "prompt_tokens", "cost_rub", "attempts", "status", "run_id", "started_at"])
    failed, pending = mine("failed", ["reason"]), mine("pending", ["reason"])
    # requests journaled by a killed earlier run, paid before this run's balance was read
    carried = [t.filter(pc.not_equal(t.column("run_id"), run_id)) for t in req]
    carried_micro = _sum_micro(carried, "cost_rub")
    pending_reasons = _reasons(pending)
    embedded, n_failed, n_pending = (sum(t.num_rows for t in ts) for ts in (emb, failed, pending))
    # a row whose vector an earlier run paid for keeps that run's request id (and costs 0)
    paid_here = pa.chunked_array([t.column("request_id") for t in req], pa.string()).combine_chunks()
    reused = sum(pc.sum(pc.invert(pc.is_in(t.column("request_id"), value_set=paid_here))).as_py() or 0 for t in emb)
    return {
        "run_id": run_id, "chunks": embedded + n_failed + n_pending, "embedded": embedded, "reused": reused,
        "failed": n_failed,
        "pending": n_pending, "failed_reasons": _reasons(failed), "pending_reasons": pending_reasons,
        "requests": sum(t.num_rows for t in req),
        "requests_answered": sum(pc.sum(pc.equal(t.column("status"), 200)).as_py() or 0 for t in req),
        "requests_retried": sum(pc.sum(pc.greater(t.column("attempts"), 1)).as_py() or 0 for t in req),
        "prompt_tokens": sum(pc.sum(t.column("prompt_tokens")).as_py() or 0 for t in req),
        "cost_rub": from_micro(_sum_micro(req, "cost_rub") - carried_micro),
        "carried_over_from_journal_rub": from_micro(carried_micro),
        "exit_code": exit_code(pending_reasons),
        "_own_requests": [t.filter(pc.equal(t.column("run_id"), run_id)) for t in req],
    }


def build_summary(out: OutputDir, view: View, *, run_id: str, model: str, metrics: dict, input_ids: int | None,
                  removed: int,
                  account_before: dict, account_after: dict, estimate: dict, catalogue: Mapping[str, float],
                  caps: dict, started: dt.datetime, other_runs: tuple[str, ...] = ()) -> dict:
    """OTHER_RUNS: runs of the same command (a switch's target) whose unanswered requests the
    reconciliation lists too; CATALOGUE: RUB per token by model name."""
    figures = run_figures(out, run_id)
    own, carried = figures.pop("_own_requests"), figures.pop("carried_over_from_journal_rub")
    rows_by_request = _micro_by_request(read_tables(out.history_files("embeddings"), ["cost_rub", "request_id"]))
    recon = reconcile(out.path, run_ids=(run_id, *other_runs), requests=_all_requests(out),
                      rows_by_request=rows_by_request, account_after=account_after,
                      catalogue=catalogue, catalogue_price=catalogue[model])
    recon["carried_over_from_journal_rub"] = carried
    return {
        **figures, "model": model, "documents": metrics.get("documents", 0), "estimate": estimate,
        # attempts that timed out after sending: each may have been billed without an answer
        "timed_out_attempts": metrics.get("timed_out_attempts", 0),
        "changes": _changes(out, run_id, input_ids, removed), "current": _current(out, view),
        "balance_before": account_before.get("balance"), "balance_after": account_after.get("balance"),
        "stats_before": account_before.get("stats"), "stats_after": account_after.get("stats"),
        "caps": caps,   # the caps set, and the limit that bound at the start
        "reconciliation": recon, "metrics": metrics,
        "timing": _timing(own, started), "files": view.reader_files,
    }

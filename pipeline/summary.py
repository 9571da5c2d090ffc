"""summary.json: totals, reconciliation (pipeline/history.py) and the list of current files,
written last, atomically.

Built from the output files themselves (the durable truth), not from in-memory counters.
"""
from __future__ import annotations

import collections
import json
import uuid

import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline import history
from transforms import journal
from transforms.apportion import from_micro, to_micro
from transforms.send import BALANCE, BUDGET, FORBIDDEN, INVALID, PREFLIGHT, UNAUTHORIZED, UNAVAILABLE

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_DOES_NOT_FIT, EXIT_PARTIAL = 0, 1, 2, 3, 4


def run_files(output_dir: str, kind: str, run_id: str | None = None) -> list[str]:
    pattern = FileSystems.join(output_dir, f"{kind}-{run_id or '*'}-*.parquet")
    return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)


def read_columns(paths: list[str], columns: list[str]):
    tables = []
    for path in paths:
        with FileSystems.open(path) as fh:
            tables.append(pq.read_table(fh, columns=columns))
    return tables


def _sum_micro(tables, column: str) -> int:
    return sum(to_micro(v) for t in tables for v in t.column(column).to_pylist() if v is not None)


REQUEST_COLUMNS = ["request_id", "model", "total_tokens", "cost_rub", "balance_after", "attempts", "latency_ms",
                   "status", "started_at", "run_id"]


def _all_requests(output_dir: str) -> list[dict]:
    """Every request row in DIR: the requests files, then journaled ones not written yet."""
    rows = {r["request_id"]: r for t in read_columns(run_files(output_dir, "requests"), REQUEST_COLUMNS)
            for r in t.to_pylist()}
    for r in journal.read_requests(output_dir, skip=set(rows)):
        rows[r["request_id"]] = r
    return list(rows.values())


def _micro_by_request(tables) -> dict[str, int]:
    totals: dict[str, int] = collections.defaultdict(int)
    for t in tables:
        for request_id, cost in zip(t.column("request_id").to_pylist(), t.column("cost_rub").to_pylist()):
            totals[request_id] += to_micro(cost or 0)
    return dict(totals)


def _reasons(tables) -> dict[str, int]:
    counts = collections.Counter()
    for t in tables:
        counts.update(t.column("reason").to_pylist())
    return dict(sorted(counts.items()))


def exit_code(pending_reasons: dict[str, int]) -> int:
    if any(r in pending_reasons for r in (UNAUTHORIZED, FORBIDDEN, UNAVAILABLE, INVALID)):
        return EXIT_FAILED
    if PREFLIGHT in pending_reasons:
        return EXIT_DOES_NOT_FIT
    if BUDGET in pending_reasons or BALANCE in pending_reasons:
        return EXIT_PARTIAL
    return EXIT_OK


def build_summary(*, output_dir: str, run_id: str, model: str, documents: int,
                  account_before: dict, account_after: dict, estimate: dict, metrics: dict,
                  catalogue_price: float, carried_files: tuple[str, ...] = (), caps: dict | None = None) -> dict:
    emb = read_columns(run_files(output_dir, "embeddings", run_id), ["cost_rub", "request_id"])
    req = read_columns(run_files(output_dir, "requests", run_id),
                       ["request_id", "prompt_tokens", "cost_rub", "attempts", "status", "run_id"])
    failed = read_columns(run_files(output_dir, "failed", run_id), ["reason"])
    pending = read_columns(run_files(output_dir, "pending", run_id), ["reason"])
    req_micro = _sum_micro(req, "cost_rub")
    # requests journaled by a killed earlier run, paid before this run's balance was read
    carried = [t.filter(pc.not_equal(t.column("run_id"), run_id)) for t in req]
    carried_micro = _sum_micro(carried, "cost_rub")
    answered = sum(pc.sum(pc.equal(t.column("status"), 200)).as_py() or 0 for t in req)
    retried = sum(pc.sum(pc.greater(t.column("attempts"), 1)).as_py() or 0 for t in req)
    rows_by_request = _micro_by_request(read_columns(run_files(output_dir, "embeddings"), ["cost_rub", "request_id"]))
    recon = history.reconcile(output_dir, run_id=run_id, requests=_all_requests(output_dir),
                              rows_by_request=rows_by_request, account_after=account_after,
                              catalogue_price=catalogue_price)
    recon["carried_over_from_journal_rub"] = from_micro(carried_micro)
    before, after = account_before.get("balance"), account_after.get("balance")
    pending_reasons = _reasons(pending)
    current = (run_files(output_dir, "embeddings") + run_files(output_dir, "requests")
               + run_files(output_dir, "failed", run_id) + run_files(output_dir, "pending", run_id)
               + run_files(output_dir, "documents", run_id))
    return {
        "run_id": run_id, "model": model, "documents": documents,
        "chunks": sum(t.num_rows for t in emb) + sum(t.num_rows for t in failed) + sum(t.num_rows for t in pending),
        "embedded": sum(t.num_rows for t in emb), "failed": sum(t.num_rows for t in failed),
        "pending": sum(t.num_rows for t in pending), "failed_reasons": _reasons(failed),
        "pending_reasons": pending_reasons, "requests": sum(t.num_rows for t in req),
        "requests_answered": answered, "requests_retried": retried,
        "prompt_tokens": sum(pc.sum(t.column("prompt_tokens")).as_py() or 0 for t in req),
        "cost_rub": from_micro(req_micro - carried_micro), "estimate": estimate,
        "balance_before": before, "balance_after": after,
        "stats_before": account_before.get("stats"), "stats_after": account_after.get("stats"),
        "caps": caps or {},   # the caps set, and the limit that bound at the start
        "reconciliation": recon, "metrics": metrics, "exit_code": exit_code(pending_reasons),
        "files": list(carried_files) + [FileSystems.split(f)[1] for f in current],
    }


def write_summary(output_dir: str, summary: dict) -> str:
    final = FileSystems.join(output_dir, "summary.json")
    temp = f"{final}.tmp-{uuid.uuid4().hex}"
    with FileSystems.create(temp) as fh:
        fh.write(json.dumps(summary, indent=2, default=str).encode())
    FileSystems.rename([temp], [final])  # replaces an earlier summary in one step (os.rename)
    return final

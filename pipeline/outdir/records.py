"""Each run's record in DIR/_runs/<run_id>.json: its start (balance, key budget, stats: the
reconciliation of money starts at the first one, pipeline/money/reconcile.py) and its finish."""
from __future__ import annotations

import datetime as dt
import os
import socket
from typing import Any

from apache_beam.io.filesystems import FileSystems

from pipeline.outdir.jsonfiles import read_json, write_json

RUNS_DIR = "_runs"
SEARCH = "search"   # the mode of a search's record: its one request embeds a query, it writes no rows


def _path(output_dir: str, run_id: str) -> str:
    return FileSystems.join(output_dir, RUNS_DIR, f"{run_id}.json")


def record_start(output_dir: str, run_id: str, model: str, mode: str, account: dict[str, Any],
                 base_url: str | None = None, chunking: dict[str, Any] | None = None) -> None:
    """Durable before the run's first paid request: DIR's reconciliation starts here. BASE_URL:
    the service's, as DIR may keep it (pipeline/terminal/hints.remembered), for `search`.
    CHUNKING: what cut the texts it pays for, which a --resume of its journal must cut alike."""
    write_json(_path(output_dir, run_id), {
        "run_id": run_id, "model": model, "mode": mode, "host": socket.gethostname(), "pid": os.getpid(),
        "started_at": dt.datetime.now(dt.UTC).isoformat(), **account,
        **({"base_url": base_url} if base_url else {}), **({"chunking": chunking} if chunking else {})})


def read_record(output_dir: str, run_id: str) -> dict[str, Any] | None:
    record: dict[str, Any] | None = read_json(_path(output_dir, run_id))
    return record


def record_finish(output_dir: str, run_id: str, account_after: dict[str, Any],
                  unanswered: list[dict[str, Any]]) -> None:
    """The run's final balance, and its requests that got no answer (their intents go with the
    journal): the history still knows what they may have cost."""
    path = _path(output_dir, run_id)
    record = read_json(path)
    record.update(finished_at=dt.datetime.now(dt.UTC).isoformat(), after=account_after,
                  unanswered=unanswered)
    write_json(path, record)


def add_unanswered(output_dir: str, run_id: str, unanswered: list[dict[str, Any]]) -> bool:
    """A run that never finished: its requests without an answer kept in its record, as
    record_finish keeps a finished run's, before its journal goes. False: it has no record."""
    path = _path(output_dir, run_id)
    record = read_json(path)
    if record is None:
        return False
    record["unanswered"] = record.get("unanswered", []) + unanswered
    write_json(path, record)
    return True


def read_records(output_dir: str) -> list[dict[str, Any]]:
    found = FileSystems.match([FileSystems.join(output_dir, RUNS_DIR, "*.json")])[0].metadata_list
    records = [r for r in map(read_json, (m.path for m in found)) if r is not None]   # None: gone meanwhile
    return sorted(records, key=lambda r: r["started_at"])


def last_base_url(output_dir: str) -> str | None:
    """The service's base URL of DIR's last run (or search) that kept one."""
    return next((r["base_url"] for r in reversed(read_records(output_dir)) if r.get("base_url")), None)

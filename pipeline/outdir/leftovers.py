"""What runs that stopped early (a kill, a full disk) left in DIR, removed by the next run that
gets to its end: temporary files, and journals whose answers are in the history.

The run holds DIR's lock (lock.py), so no other run is live here: every other run's files are
done with. Still, only what is provably redundant goes:
- temporary files: a job's `history/<run>/.temp-*/` and `.tmp-*`, a journal entry's `.tmp-*`
  and `.space` (never a whole entry), other runs' progress reports; a JSON file's `.tmp-*` and a
  `.write-probe-*` only once older than a minute (this run's own lock is rewritten meanwhile);
- a journal entry whose request is in a history requests file and whose every text is in a
  history embeddings file with that request id (the run after a kill writes them so);
- then that run's intents: those without an answer move into its record in `_runs/` (the
  reconciliation reads them there, as for a run that finished), and its journal goes.
"""
from __future__ import annotations

import glob
import logging
import os
import time

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.filesystems import FileSystems

from pipeline.outdir import layout, records
from pipeline.outdir.jsonfiles import TEMP
from transforms.files import delete_each
from transforms.money import journal
from transforms.read.parquet import read_tables
from transforms.worker import progress

MIN_AGE_S = 60.0   # a JSON file's temporary name lives for milliseconds: older than this, it is left over

log = logging.getLogger("embedpipe")


def _match(pattern: str) -> list[FileMetadata]:
    return list(FileSystems.match([pattern])[0].metadata_list)


def _delete(paths: list[str]) -> None:
    """Each at most a warning: a leftover that stays is not worth the run."""
    for path, exc in delete_each(paths):
        log.warning("could not remove %s, left by an earlier run: %s", path, exc)


def _run_of(path: str, base: str) -> str:
    """The run id of a path under BASE/<run>/."""
    return layout.relative(base, path).split("/", 1)[0]


def remove(output_dir: str, live: set[str]) -> None:
    """Leftovers of every run but those in LIVE (this command's)."""
    old = time.time() - MIN_AGE_S
    patterns = (layout.PROBE + "*", f"*{TEMP}*", f"{records.RUNS_DIR}/*{TEMP}*", f"{layout.VIEWS}/*{TEMP}*")
    _delete([m.path for pattern in patterns for m in _match(layout.join(output_dir, pattern))
             if (m.last_updated_in_seconds or 0) < old])
    history = layout.join(output_dir, layout.HISTORY)
    temps = [m.path for m in _match(layout.join(history, "*/.temp-*/*"))]   # the objects, on object stores
    if FileSystems.get_scheme(history) in (None, "file"):   # on local disks the directories, empty or not
        temps = glob.glob(os.path.join(history, "*", ".temp-*"))
    temps += [m.path for m in _match(layout.join(history, f"*/*{TEMP}*"))]   # late copies being written
    _delete([p for p in temps if _run_of(p, history) not in live])
    base = journal.journal_dir(output_dir)
    runs = {_run_of(m.path, base) for m in _match(FileSystems.join(base, "*", "*"))} - live
    if runs:
        answered = _answered(output_dir)
        for run_id in sorted(runs):
            _clean_journal(output_dir, run_id, answered)
    reports = FileSystems.join(output_dir, progress.PROGRESS_DIR)
    for run_id in {_run_of(m.path, reports) for m in _match(FileSystems.join(reports, "*", "*"))} - live:
        progress.discard(output_dir, run_id)


def _clean_journal(output_dir: str, run_id: str, answered: dict[str, int]) -> None:
    folder = journal.journal_dir(output_dir, run_id)
    names = {FileSystems.split(m.path)[1]: m.path for m in _match(FileSystems.join(folder, "*"))}
    _delete([p for n, p in names.items() if TEMP in n or n.endswith(journal.SPACE_SUFFIX)])
    entries = {n[:-len(".parquet")]: p for n, p in names.items() if n.endswith(".parquet")}
    written = _written(output_dir, entries, answered)
    _delete([entries[r] for r in written])
    if set(entries) - written:
        return   # answers paid for that no history file holds yet: the journal stays
    intents = [i for i in journal.read_intents(output_dir) if i["run_id"] == run_id]
    unanswered = [{**i, "attempts": answered.get(i["request_id"], 1)} for i in intents
                  if answered.get(i["request_id"]) != 0]
    if unanswered and not records.add_unanswered(output_dir, run_id, unanswered):
        return   # no record to keep them in: the reconciliation reads them here
    journal.discard(output_dir, run_id)


def _answered(output_dir: str) -> dict[str, int]:
    """request_id -> 0 when a history requests file has it answered (200), else its attempts."""
    found: dict[str, int] = {}
    paths = [m.path for m in _match(layout.join(output_dir, f"{layout.HISTORY}/*/requests-*.parquet"))]
    for t in read_tables(paths, ["request_id", "status", "attempts"]):
        columns = (t.column(c).to_pylist() for c in ("request_id", "status", "attempts"))
        for request_id, status, attempts in zip(*columns, strict=True):
            found[request_id] = 0 if status == 200 or found.get(request_id) == 0 else attempts
    return found


def _written(output_dir: str, entries: dict[str, str], answered: dict[str, int]) -> set[str]:
    """The request ids of ENTRIES whose request and every text are in the history."""
    ids = pa.array([r for r in entries if answered.get(r) == 0], pa.string())
    if not len(ids):
        return set()
    held: set[tuple[str, str]] = set()
    paths = [m.path for m in _match(layout.join(output_dir, f"{layout.HISTORY}/*/embeddings-*.parquet"))]
    for t in read_tables(paths, ["request_id", "text_sha256"]):
        t = t.filter(pc.is_in(t.column("request_id"), value_set=ids))
        held.update(zip(t.column("request_id").to_pylist(), t.column("text_sha256").to_pylist(), strict=True))
    done = set()
    for request_id in ids.to_pylist():
        _, table = journal.read_path(entries[request_id], ["text_sha256"])
        if all((request_id, sha) in held for sha in table.column("text_sha256").to_pylist()):
            done.add(request_id)
    return done

"""Where DIR's state lives (paths relative to DIR, '/'-separated, the same on every filesystem).

    current -> _views/<view>/    the current view for glob readers: a symlink, switched
                                 atomically, to a directory of hard links (local disks only)
    target -> _views/<view>/     while DIR switches to another model: that model's view, being
                                 built beside the current one (the same kind of link)
    summary.json                 the last run's summary; `files` lists the current view
    history/<run>/               everything a run's job wrote, never changed afterwards:
                                 requests, every row it paid for, its dead letters, the
                                 documents it found changed; its pending rows (texts, not paid
                                 for) until no kept view holds them
    _current.json                the current view's manifest (the commit point)
    _target.json, _switch.json   while DIR switches to another model: the target view's
                                 manifest, and the switch (from, to, its runs: pipeline/outdir/switch.py)
    _views/<view>.json           manifests of the views kept for readers still on them
    _segments/                   files a commit derived from others (rows filtered out or moved)
    _runs/<run>.json             each run's start and finish (balance, stats): the
                                 reconciliation (records.py)
    _journal/<run>/              answers paid for and not yet in history (transforms/money/journal.py)
    _lock.json, _progress/       the live run (lock.py, transforms/worker/progress.py)
    _postgres/                   the embedded PostgreSQL's data (`publish --to embedded`:
                                 pipeline/publish/target.py); local disks only

A view's id is the id of the run that committed it.
"""
from __future__ import annotations

import dataclasses

from apache_beam.io.filesystems import FileSystems


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where a view is served from: its link for glob readers and its manifest."""
    link: str
    pointer: str


CURRENT = Slot("current", "_current.json")
TARGET = Slot("target", "_target.json")   # a switch's view of the other model
SWITCH = "_switch.json"
SUMMARY = "summary.json"
HISTORY = "history"
VIEWS = "_views"
SEGMENTS = "_segments"
POSTGRES = "_postgres"
PROBE = ".write-probe-"   # a run's first write, at DIR's top, removed at once (OutputDir.check_writable)

# What a reader of the current view sees, and what only the next run reads.
READER_KINDS = ("embeddings", "failed", "pending", "documents", "requests")
STAGED_KINDS = ("staged-embeddings", "staged-failed")   # a new version of a document, not complete
KINDS = READER_KINDS + STAGED_KINDS


def join(output_dir: str, relative: str) -> str:
    return FileSystems.join(output_dir, *relative.split("/"))


def relative(output_dir: str, path: str) -> str:
    root = output_dir.rstrip("/") + "/"
    if not path.startswith(root):
        raise ValueError(f"{path} is not under {output_dir}")
    return path[len(root):]


def run_dir(run_id: str) -> str:
    return f"{HISTORY}/{run_id}"


def view_manifest(view: str) -> str:
    return f"{VIEWS}/{view}.json"


def view_links(view: str) -> str:
    return f"{VIEWS}/{view}"


def segment(kind: str, view: str, n: int) -> str:
    return f"{SEGMENTS}/{kind}-{view}-{n:05d}.parquet"


def docindex(view: str) -> str:
    return f"{SEGMENTS}/docindex-{view}.parquet"


def kind_of(path: str) -> str:
    """The kind of a data file from its name: `<kind>-<run or view>-...parquet`."""
    name = path.rsplit("/", 1)[-1]
    for kind in sorted(KINDS + ("changes",), key=len, reverse=True):
        if name.startswith(kind + "-"):
            return kind
    raise ValueError(f"{path}: not a data file of an output directory")

"""DIR's state in one place: the current view, the history of runs, the journals, the lock.

    out = OutputDir(path)
    out.view                      the current view (pipeline/outdir/view.py), or None
    out.target()                  the same DIR seen from a switch's target view (switch.py)
    out.history_files(kind)       what every run's job wrote (what was paid, when, by whom)
    out.journal_entries(m, d)     answers killed runs paid for and never wrote
    out.lock(run_id, settings)    one live run per DIR
    out.commit(...)               the run's outcome becomes the current view
    out.remove_leftovers(live)    what runs that stopped early left behind
    out.write_summary(summary)

The layout on disk is pipeline/outdir/layout.py.
"""
from __future__ import annotations

import functools
import logging
import re
import uuid
from typing import Any

import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.exits import UsageError
from pipeline.outdir import layout, leftovers, records, space
from pipeline.outdir import view as views
from pipeline.outdir.commit import Rewrite, RunFiles, next_view
from pipeline.outdir.jsonfiles import write_json
from pipeline.outdir.lock import RUN_AGAIN, OutputLock
from pipeline.outdir.view import View
from pipeline.settings.config import LockSettings
from transforms.files import delete_each
from transforms.money import journal
from transforms.read.parquet import read_tables, row_count
from transforms.write.transform import Codec

log = logging.getLogger("embedpipe")

# A run's file at the top of DIR: how outputs were laid out before the current view existed.
_EARLIER_LAYOUT = re.compile(
    r"^(?:embeddings|requests|failed|pending|documents)-(\d{8}T\d{6}Z-[0-9a-f]{6})-.*\.parquet$")


def _make_dirs(path: str) -> None:
    try:
        FileSystems.mkdirs(path)
    except Exception:  # there already, or a store without directories
        pass


class OutputDir:
    """DIR, as the view of SLOT sees it: the current one, or a switch's target. History,
    journals, records and the lock are DIR's, whatever the slot."""

    def __init__(self, path: str, slot: layout.Slot = layout.CURRENT):
        self.path, self.slot = path, slot

    def target(self) -> OutputDir:
        return OutputDir(self.path, layout.TARGET)

    def join(self, relative: str) -> str:
        return layout.join(self.path, relative)

    def relative(self, path: str) -> str:
        return layout.relative(self.path, path)

    # -- what DIR holds ---------------------------------------------------------------------

    @functools.cached_property
    def view(self) -> View | None:
        return views.load(self.path, self.slot)

    def require_view(self) -> View:
        """The view, for a command that reads DIR and writes nothing unless DIR has one (a
        mistyped DIR is refused, never made)."""
        if self.view is None:
            raise UsageError(f"{self.path} has no view of embeddings (no run committed one there): check DIR, or "
                             f"run `python -m pipeline run ... --output {self.path}` first")
        return self.view

    def _match(self, pattern: str) -> list[str]:
        return sorted(m.path for m in FileSystems.match([self.join(pattern)])[0].metadata_list)

    def run_dir(self, run_id: str) -> str:
        return self.join(layout.run_dir(run_id))

    def make_run_dir(self, run_id: str) -> str:
        """RUN_ID's history directory, there from the job's start (its writers only make it
        with their first file, mid-run)."""
        path = self.run_dir(run_id)
        _make_dirs(path)
        return path

    def history_files(self, kind: str, run_id: str | None = None) -> list[str]:
        """Files of KIND that runs' jobs wrote (RUN_ID's only, when given)."""
        return self._match(f"{layout.run_dir(run_id or '*')}/{kind}-*.parquet")

    def journal_entries(self, model: str, dims: int) -> tuple[list[str], list[dict[str, Any]]]:
        """Answers paid by killed runs for MODEL at DIMS: (entry paths, request rows that no
        history requests file has)."""
        written = {r for t in read_tables(self.history_files("requests"), ["request_id"])
                   for r in t.column("request_id").to_pylist()}
        return journal.unwritten(self.path, written, model, dims)

    def holds_results(self) -> bool:
        """Whether a run paid for something here: vectors in the view, requests in the
        history, answers in a journal. A DIR with none of these may be taken over."""
        if self.view is not None and (self.view.rows("embeddings") or self.view.rows("staged-embeddings")):
            return True
        if any(row_count(p) for p in self.history_files("requests")):
            return True
        return bool(self._match(f"{journal.JOURNAL_DIR}/*/*.parquet"))

    def learned_price(self, model: str | None = None) -> float | None:
        """RUB per token actually billed in the requests of earlier runs (of MODEL only, when
        given: `plan --model all` must not price one model with another's bills)."""
        tables = read_tables(self.history_files("requests"), ["cost_rub", "total_tokens", "model"])
        if model is not None:
            tables = [t.filter(pc.equal(t.column("model"), model)) for t in tables]
        cost = sum(pc.sum(t.column("cost_rub")).as_py() or 0 for t in tables)
        tokens = sum(pc.sum(t.column("total_tokens")).as_py() or 0 for t in tables)
        return cost / tokens if tokens else None

    # -- a run ------------------------------------------------------------------------------

    def check_writable(self) -> None:
        """A probe written and removed; a full disk is an OSError for the caller to name."""
        probe = FileSystems.join(self.path, f"{layout.PROBE}{uuid.uuid4().hex}")
        _make_dirs(self.path)   # whether DIR is writable, the probe below decides
        try:
            with FileSystems.create(probe) as fh:
                fh.write(b"ok")
        except Exception as exc:
            if space.is_full(exc):
                raise
            raise UsageError(f"--output {self.path}: not writable ({exc})") from None
        finally:
            delete_each([probe])   # one left is a leftover: the next run removes it (leftovers.py)

    def lock(self, run_id: str, settings: LockSettings, again: str = RUN_AGAIN) -> OutputLock:
        return OutputLock(self.path, run_id, settings, again)

    def record_start(self, run_id: str, model: str, mode: str, account: dict[str, Any],
                     base_url: str | None = None, chunking: dict[str, Any] | None = None) -> None:
        records.record_start(self.path, run_id, model, mode, account, base_url, chunking)

    def record_finish(self, run_id: str, account_after: dict[str, Any], unanswered: list[dict[str, Any]]) -> None:
        records.record_finish(self.path, run_id, account_after, unanswered)

    def adopt_earlier_layout(self) -> None:
        """DIR written before it had a current view (every run's files at its top): each file
        moves into its run's history. Nothing is paid again: the next run finds every text
        there, and its view's rows reuse those vectors at no cost."""
        found = [m.path for m in FileSystems.match([self.join("*.parquet")])[0].metadata_list
                 if _EARLIER_LAYOUT.match(m.path.rsplit("/", 1)[-1])]
        if not found:
            return
        names = [p.rsplit("/", 1)[-1] for p in found]
        runs = [layout.run_dir(m.group(1)) for m in map(_EARLIER_LAYOUT.match, names) if m]   # each matched above
        for run in set(runs):
            _make_dirs(self.join(run))
        FileSystems.rename(found, [self.join(f"{run}/{name}") for run, name in zip(runs, names, strict=True)])
        log.info("moved %d files of an earlier layout of %s into its history/", len(found), self.path)

    def repair_link(self) -> None:
        """A run stopped between its commit point and the link: point the slot's link at the view."""
        if self.view is not None and views.linked(self.path, self.slot) != self.view.view:
            views.link(self.path, self.view, self.slot)

    def commit(self, run: RunFiles, previous: View | None, template: View, codec: Codec, rewrite: Rewrite) -> View:
        """RUN's outcome becomes the current view (after PREVIOUS, the view the run started
        from): its files, the manifest, the link. A commit that fails before its commit point
        removes its own files at once: they would take the room the next try needs."""
        try:
            return self.serve(next_view(self.path, previous, run, template, codec, rewrite))
        except Exception:
            self._discard_unserved(run.run_id)
            raise

    def _discard_unserved(self, view_id: str) -> None:
        """The files of VIEW_ID (its segments, document index and manifest) unless the slot's
        pointer names it: its commit point was reached (the link may have failed after it)."""
        patterns = [self.join(f"{layout.SEGMENTS}/*-{view_id}*.parquet"), self.join(layout.view_manifest(view_id))]
        try:
            served = views.load(self.path, self.slot)
            if served is None or served.view != view_id:
                left = delete_each([m.path for r in FileSystems.match(patterns) for m in r.metadata_list])
                if left:
                    raise left[0][1]
        except Exception as exc:   # the failure to report is the commit's; the next run's start retries
            log.warning("could not remove the files of a failed commit in %s: %s", self.path, exc)

    def serve(self, view: View) -> View:
        """VIEW becomes the slot's view: the manifest (the commit point), then the link."""
        new = views.save(self.path, view, self.slot)
        views.link(self.path, new, self.slot)
        self.__dict__["view"] = new
        return new

    def clear(self) -> None:
        """The slot serves nothing any more."""
        views.clear(self.path, self.slot)
        self.__dict__["view"] = None

    def write_summary(self, summary: dict[str, Any]) -> None:
        write_json(self.join(layout.SUMMARY), summary, indent=2)

    def collect_garbage(self, keep: int) -> None:
        views.collect_garbage(self.path, keep)

    def remove_leftovers(self, live: set[str]) -> None:
        """What runs that stopped early left (pipeline/outdir/leftovers.py); LIVE: this command's runs."""
        try:
            leftovers.remove(self.path, live)
        except Exception as exc:   # the run itself is done: a leftover that stays is worth a warning
            log.warning("could not remove what earlier runs left in %s: %s", self.path, exc)


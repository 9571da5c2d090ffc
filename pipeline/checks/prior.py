"""What a run starts from, checked before anything is sent: DIR's current view (what it serves
and builds, the documents an input no longer has), and every store of vectors already paid
for (DIR's history and journals, --known). Fresh runs, --resume, --sync and --known are one
path: they differ only in what the view holds and whether missing documents leave it."""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.checks.chunking import describe, view_chunking
from pipeline.checks.inputs import InputInfo
from pipeline.exits import UsageError
from pipeline.outdir import OutputDir, records
from pipeline.outdir.kept import Mismatch, unify, view_fields
from pipeline.outdir.view import View
from pipeline.settings.job import FRESH, SYNC, Job
from transforms.dedupe.known import KNOWN_COLUMNS
from transforms.read.changes import Chunking
from transforms.read.parquet import open_parquet, parquet_file, read_tables

log = logging.getLogger("embedpipe")


@dataclasses.dataclass(frozen=True)
class Prior:
    view: View | None = None
    docindex: str | None = None              # the view's document index (absolute path)
    pending: tuple[str, ...] = ()            # --resume without --input: the view's pending rows
    known: tuple[str, ...] = ()              # embeddings files whose vectors are reused
    journal: tuple[str, ...] = ()            # answers killed runs paid for, not written
    journal_requests: tuple[dict[str, Any], ...] = ()  # their request rows, written by this run

    @property
    def reuses(self) -> bool:
        return bool(self.known or self.journal)


def _fits(view: View, job: Job) -> bool:
    return (view.model, view.dimensions) == (job.model.name, job.dimensions) and \
        (not job.opts.input or (tuple(view.kept) == job.keep_columns and _same_chunks(view, job)))


def _same_chunks(view: View, job: Job) -> bool:
    return view_chunking(view, job.model, job.chunking) == job.chunking


def _check_view(view: View, job: Job, out: OutputDir) -> None:
    """A view holds one model's vectors of one length, of one chunking, in rows of one schema:
    other kept columns are adopted by a --sync only, which makes every row again (every vector
    reused)."""
    flag = "" if job.mode == FRESH else f"--{job.mode}: "
    if (view.model, view.dimensions) != (job.model.name, job.dimensions):
        raise UsageError(f"{flag}--output {out.path} holds {view.model} vectors of length {view.dimensions}; "
                         f"this run is {job.model.name} with length {job.dimensions}: pass --sync --switch-model "
                         "to move it to that model (its view is built beside the served one, over as many runs "
                         "as the budget needs), or use another --output directory for it")
    if job.opts.input and not _same_chunks(view, job):
        raise UsageError(f"{flag}--output {out.path} holds {describe(view_chunking(view, job.model, job.chunking))}; "
                         f"this run cuts {describe(job.chunking)}: pass the view's, or --sync --switch-model to move "
                         "it to these chunks (their view is built beside the served one, over as many runs as the "
                         "budget needs), or use another --output directory for them")
    if job.opts.input and tuple(view.kept) != job.keep_columns:
        same = f"--keep-columns {','.join(view.kept)}" if view.kept else "no --keep-columns"
        if job.mode != SYNC:
            raise UsageError(f"{flag}--output {out.path} keeps the columns {list(view.kept) or 'none'} in its rows, "
                             f"this run {list(job.keep_columns) or 'none'}: other kept columns are adopted by a run "
                             "with --sync and the whole corpus as --input (every row made again, every vector "
                             f"reused, nothing paid), or pass {same} as the view has")
        log.warning("--output %s keeps the columns %s in its rows; this run makes every row again with %s (every "
                    "vector reused, nothing paid for them): if that is not meant, pass %s as the view has", out.path,
                    list(view.kept) or "none", list(job.keep_columns) or "none", same)


def _check_journal(job: Job, out: OutputDir, paths: Sequence[str]) -> None:
    """The answers a killed run journaled are found again by their chunks' text: cut otherwise,
    none matches, and all it paid is lost. Runs recorded before records kept their chunking
    are not known, so not refused; a switch builds another chunking on purpose."""
    if job.switching:
        return
    runs = {FileSystems.split(FileSystems.split(p)[0])[1] for p in paths}
    for run_id in sorted(runs):
        chunking = Chunking.from_dict((records.read_record(out.path, run_id) or {}).get("chunking"))
        if chunking is None or chunking == job.chunking:
            continue
        flags = f"--chunk-tokens {chunking.chunk_tokens} --overlap-tokens {chunking.overlap_tokens}"
        if chunking.boundary_window != job.chunking.boundary_window:
            flags += f" and split.boundary_window {chunking.boundary_window:g} in --config"
        flag = "" if job.mode == FRESH else f"--{job.mode}: "
        served = out.view and (out.view.model, out.view.dimensions) == (job.model.name, job.dimensions) and \
            view_chunking(out.view, job.model, job.chunking)
        resume = (f"pass --sync --switch-model {flags} to resume the switch to them it was building" if served
                  and served != chunking else f"pass {flags} to resume it, then change the chunks with --sync "
                  "--switch-model")
        raise UsageError(f"{flag}--output {out.path} holds the journal of interrupted run {run_id}, paid for and "
                         f"not yet written, which cut {describe(chunking)}; this run cuts {describe(job.chunking)} "
                         f"and would find none of those answers: {resume}, or use another --output directory")


def check_model(job: Job, out: OutputDir) -> None:
    """`plan` refuses what `run` would: another model than the view's, without --switch-model,
    or a killed run's journal under other chunks."""
    if out.view is not None and out.holds_results():
        _check_view(out.view, job, out)
    _check_journal(job, out, out.journal_entries(job.model.name, job.dimensions)[0])


def check_kept(job: Job, out: OutputDir | None, info: InputInfo) -> InputInfo:
    """INFO with the kept fields the run writes: the join of the view's and the input's types
    (pipeline/outdir/kept.py), or a usage error naming the column and both types. A view
    whose kept columns the run changes (--sync) is made again from the input's alone."""
    if out is None or (view := out.view) is None or not job.opts.input or tuple(view.kept) != job.keep_columns \
            or not info.kept_fields:
        return info
    if not out.holds_results() and not _fits(view, job):   # taken over by this run (prior)
        return info
    try:
        return dataclasses.replace(info, kept_fields=unify(view_fields(out.path, view), info.kept_fields))
    except Mismatch as exc:
        raise UsageError(
            f"kept column {exc.name} is {exc.was} in the view of --output {out.path} and {exc.now} in --input "
            f"{job.opts.input}: no type holds both exactly (a view widens a column only where no value changes: "
            f"int32 to int64, float32 to float64...); write it as {exc.was} again, or drop it and add it again: a "
            f"--sync with --keep-columns without {exc.name}, then one with it, make every row again at no cost"
        ) from None


def _known_files(globs: Sequence[str]) -> list[str]:
    files = []
    for glob in globs:
        matches = FileSystems.match([glob])[0].metadata_list
        if not matches:
            raise UsageError(f"--known {glob}: no file matches")
        for m in matches:
            with open_parquet(m.path) as fh:
                names = pq.read_schema(fh).names
            if missing := [c for c in KNOWN_COLUMNS if c not in names]:
                raise UsageError(f"--known {m.path}: not an embeddings file (no {', '.join(missing)})")
            files.append(m.path)
    return files


def prior(job: Job, out: OutputDir | None, *, checked: bool = True) -> Prior:
    """CHECKED (run): the mode must fit what DIR holds; `plan` only looks."""
    known = _known_files(job.opts.known)
    if out is None:
        return Prior(known=tuple(known))
    view, results = out.view, out.holds_results()
    if checked and job.mode == FRESH and results:
        raise UsageError(f"--output {out.path} already holds an earlier run's results or journal: pass --sync "
                         "when the input is the whole corpus (DIR becomes exactly it: edited documents are "
                         "embedded again, removed ones leave, nothing is paid twice), --resume to bring only "
                         "the input's documents up to date, or choose another directory")
    if view is not None and not results and not _fits(view, job):
        view = None   # pending rows of a run that paid nothing (exit 3): another model may take over
    if view is not None and checked:
        _check_view(view, job, out)
    if checked and not job.opts.input and view is None:
        raise UsageError(f"--resume without --input sends the pending rows of a run's results, and --output "
                         f"{out.path} holds none: pass --input")
    journal, journal_requests = out.journal_entries(job.model.name, job.dimensions)
    if checked:
        _check_journal(job, out, journal)
    return Prior(view, out.join(view.docindex) if view and view.docindex else None,
                 tuple(out.join(p) for p in view.paths("pending")) if view and not job.opts.input else (),
                 tuple(out.history_files("embeddings") + known), tuple(journal), tuple(journal_requests))


def removed(prior: Prior, input_ids: pa.Array) -> pa.Array:
    """The documents of the view that the input does not have (they leave it on --sync)."""
    if prior.docindex is None:
        return pa.array([], pa.string())
    (index,) = read_tables([prior.docindex], ["doc_id"])
    ids = index.column("doc_id")
    return ids.filter(pc.invert(pc.is_in(ids, value_set=input_ids))).combine_chunks()


def pending_input(prior: Prior, out: OutputDir) -> InputInfo:
    """--resume without --input: the view's pending rows are the input, with its kept fields."""
    rows, schema = 0, None
    for path in prior.pending:
        with open_parquet(path) as fh:
            meta = parquet_file(fh).metadata
        rows, schema = rows + meta.num_rows, meta.schema.to_arrow_schema()
    kept = view_fields(out.path, prior.view) if prior.view is not None else ()
    return InputInfo(prior.pending, rows, kept, columns=tuple(schema.names) if schema else ())

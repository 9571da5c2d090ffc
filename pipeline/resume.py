"""What `--resume` and `--known` find on disk, checked before anything runs."""
from __future__ import annotations

import json

import pyarrow.compute as pc
import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.graph import KnownSources
from pipeline.inputs import InputInfo, UsageError
from pipeline.job import Job
from pipeline.summary import read_columns, run_files
from transforms.journal import journal_dir, unwritten


def _check_same_model(path: str, job: Job) -> None:
    with FileSystems.open(path) as fh:
        schema = pq.read_schema(fh)
    meta = schema.metadata or {}
    model = meta.get(b"model", b"").decode()
    dims = schema.field("embedding").type.list_size if "embedding" in schema.names else None
    if model != job.model.name or dims != job.dimensions:
        raise UsageError(f"--resume: {path} holds {model or 'unknown model'} vectors of length {dims}; "
                         f"this run is {job.model.name} with length {job.dimensions}. "
                         "Use another --output directory, or --known to reuse what matches.")


def written_request_ids(output_dir: str) -> set[str]:
    return {r for t in read_columns(run_files(output_dir, "requests"), ["request_id"])
            for r in t.column("request_id").to_pylist()}


OUTPUT_KINDS = ("embeddings", "requests", "failed", "pending", "documents")


def _rows(path: str) -> int:
    with FileSystems.open(path) as fh:
        return pq.ParquetFile(fh).metadata.num_rows


def check_fresh_output(job: Job) -> None:
    """Without --resume, DIR must not hold an earlier run's vectors or requests: a second run
    would pay for every text again and summary.json could not tell which files are current.
    What runs that sent nothing left (an estimate that did not fit, exit 3) holds nothing
    worth keeping: it is cleared so that the run the advice suggests can start."""
    out = job.opts.output
    if job.opts.resume:
        return
    journaled = FileSystems.match([FileSystems.join(journal_dir(out), "*", "*.parquet")])[0].metadata_list
    if journaled or any(_rows(p) for p in run_files(out, "embeddings") + run_files(out, "requests")):
        raise UsageError(f"--output {out} already holds an earlier run's results or journal: pass "
                         "--resume to continue it (nothing is paid twice), or choose another directory")
    unsent = [p for kind in OUTPUT_KINDS for p in run_files(out, kind)]
    summary_path = FileSystems.join(out, "summary.json")
    if FileSystems.exists(summary_path):
        unsent.append(summary_path)
    if unsent:
        FileSystems.delete(unsent)


def _last_summary(output_dir: str) -> dict:
    path = FileSystems.join(output_dir, "summary.json")
    try:
        with FileSystems.open(path) as fh:
            return json.loads(fh.read())
    except Exception:  # missing (a killed run) or unreadable
        raise UsageError(f"--resume without --input needs {path} from a finished run; "
                         "pass --input to read the corpus again") from None


def pending_input(job: Job) -> tuple[InputInfo, str, tuple[str, ...]]:
    """--resume without --input sends the pending rows of DIR's last run: (their InputInfo,
    their glob, the failed files that stay current since the corpus is not read again)."""
    out = job.opts.output
    last = _last_summary(out)
    pattern = FileSystems.join(out, f"pending-{last['run_id']}-*.parquet")
    files = sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    if not files:
        raise UsageError(f"--resume: {out} has no pending files of run {last['run_id']}")
    rows, schema = 0, None
    for path in files:
        with FileSystems.open(path) as fh:
            meta = pq.ParquetFile(fh).metadata
        rows, schema = rows + meta.num_rows, meta.schema.to_arrow_schema()
    model = (schema.metadata or {}).get(b"model", b"").decode()
    if model != job.model.name:
        raise UsageError(f"--resume: the pending rows in {out} are for {model}, not {job.model.name}")
    kept = tuple(schema.field(i) for i in range(schema.get_field_index("run_id") + 1, len(schema)))
    carried = tuple(f for f in last["files"] if f.startswith("failed-"))
    return InputInfo(tuple(files), rows, kept), pattern, carried


def known_sources(job: Job) -> KnownSources:
    opts = job.opts
    resume_glob, journal, journal_requests = None, (), ()
    if opts.resume and opts.output:
        existing = run_files(opts.output, "embeddings")  # a prefix on object stores: never exists()
        for path in existing:
            _check_same_model(path, job)
        if existing:
            resume_glob = FileSystems.join(opts.output, "embeddings-*.parquet")
        journal, journal_requests = unwritten(opts.output, written_request_ids(opts.output),
                                              job.model.name, job.dimensions)
    for glob in opts.known:
        matches = FileSystems.match([glob])[0].metadata_list
        if not matches:
            raise UsageError(f"--known {glob}: no file matches")
        for m in matches:
            with FileSystems.open(m.path) as fh:
                names = pq.read_schema(fh).names
            if missing := [c for c in ("text_sha256", "model", "request_id", "embedding") if c not in names]:
                raise UsageError(f"--known {m.path}: not an embeddings file (no {', '.join(missing)})")
    pending_glob, carried, last_pending, last_failed = None, (), (), ()
    if opts.resume and not opts.input:
        _, pending_glob, carried = pending_input(job)
    elif resume_glob and FileSystems.exists(FileSystems.join(opts.output, "summary.json")):
        files = [FileSystems.join(opts.output, f) for f in _last_summary(opts.output)["files"]]
        last_pending = tuple(f for f in files if FileSystems.split(f)[1].startswith("pending-"))
        last_failed = tuple(f for f in files if FileSystems.split(f)[1].startswith("failed-"))
    return KnownSources(resume_glob, tuple(opts.known), tuple(journal), tuple(journal_requests),
                        pending_glob, carried, last_pending, last_failed)


def learned_price(output_dir: str | None, model: str | None = None) -> float | None:
    """RUB per token actually billed in the requests of earlier runs in OUTPUT_DIR (of MODEL only,
    when given: `plan --model all` must not price one model with another's bills)."""
    if not output_dir:
        return None
    try:
        tables = read_columns(run_files(output_dir, "requests"), ["cost_rub", "total_tokens", "model"])
    except Exception:  # no such directory yet
        return None
    if model is not None:
        tables = [t.filter(pc.equal(t.column("model"), model)) for t in tables]
    cost = sum(sum(v or 0 for v in t.column("cost_rub").to_pylist()) for t in tables)
    tokens = sum(sum(v or 0 for v in t.column("total_tokens").to_pylist()) for t in tables)
    return cost / tokens if tokens else None

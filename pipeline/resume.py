"""What `--resume` and `--known` find on disk, checked before anything runs."""
from __future__ import annotations

import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.graph import KnownSources
from pipeline.inputs import UsageError
from pipeline.job import Job
from pipeline.summary import read_columns, run_files
from transforms.journal import load_unwritten


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


def check_fresh_output(job: Job) -> None:
    """Without --resume, DIR must not hold an earlier run's vectors: a second run would pay for
    every text again and summary.json could not tell which files are current."""
    if not job.opts.resume and run_files(job.opts.output, "embeddings"):
        raise UsageError(f"--output {job.opts.output} already holds embeddings of an earlier run: pass "
                         "--resume to continue it (nothing is paid twice), or choose another directory")


def known_sources(job: Job) -> KnownSources:
    opts = job.opts
    resume_glob, journal, journal_requests = None, (), ()
    if opts.resume and opts.output:
        existing = run_files(opts.output, "embeddings")  # a prefix on object stores: never exists()
        for path in existing:
            _check_same_model(path, job)
        if existing:
            resume_glob = FileSystems.join(opts.output, "embeddings-*.parquet")
        written = {r for t in read_columns(run_files(opts.output, "requests"), ["request_id"])
                   for r in t.column("request_id").to_pylist()}
        journal, journal_requests = load_unwritten(opts.output, written)
    for glob in opts.known:
        if not FileSystems.match([glob])[0].metadata_list:
            raise UsageError(f"--known {glob}: no file matches")
    return KnownSources(resume_glob, tuple(opts.known), tuple(journal), tuple(journal_requests))


def learned_price(output_dir: str | None) -> float | None:
    """RUB per token actually billed in the requests of earlier runs in OUTPUT_DIR."""
    if not output_dir:
        return None
    try:
        tables = read_columns(run_files(output_dir, "requests"), ["cost_rub", "total_tokens"])
    except Exception:  # no such directory yet
        return None
    cost = sum(sum(v or 0 for v in t.column("cost_rub").to_pylist()) for t in tables)
    tokens = sum(sum(v or 0 for v in t.column("total_tokens").to_pylist()) for t in tables)
    return cost / tokens if tokens else None

"""What `--resume` and `--known` find on disk, checked before anything runs."""
from __future__ import annotations

import pyarrow.parquet as pq
from apache_beam.io.filesystems import FileSystems

from pipeline.graph import KnownSources
from pipeline.inputs import UsageError
from pipeline.job import Job
from pipeline.summary import run_files
from transforms.journal import load_unwritten


def run_id_of(path: str, kind: str) -> str:
    """embeddings-<run_id>-00000-of-00002.parquet -> <run_id>"""
    return FileSystems.split(path)[1][len(kind) + 1:].rsplit("-", 3)[0]


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


def known_sources(job: Job) -> KnownSources:
    opts = job.opts
    resume_glob, journal, journal_requests = None, (), ()
    if opts.resume and opts.output:
        existing = run_files(opts.output, "embeddings")  # a prefix on object stores: never exists()
        for path in existing:
            _check_same_model(path, job)
        if existing:
            resume_glob = FileSystems.join(opts.output, "embeddings-*.parquet")
        written = {run_id_of(p, "embeddings") for p in existing}
        journal, journal_requests = load_unwritten(opts.output, written)
    for glob in opts.known:
        if not FileSystems.match([glob])[0].metadata_list:
            raise UsageError(f"--known {glob}: no file matches")
    return KnownSources(resume_glob, tuple(opts.known), tuple(journal), tuple(journal_requests))

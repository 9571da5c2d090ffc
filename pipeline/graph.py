"""The job's Beam graph: Read (only what changed against DIR's view) -> Dedupe (within the run
and against every store paid for) -> Pack -> Embed -> Write, into the run's directory of DIR's
history; the commit after the job (pipeline/outdir) makes it the current view.

On the local runner a run streams: texts and vectors go from Read to Write in one fused stage
and nothing large crosses a stage boundary (the FnApiRunner holds such a PCollection in memory
whole); its worker processes, when it has several, share their claims through a file and pull the
input from it as each is ready for more.
--doc-vectors and distributed runners group by text instead; the Dedupe step chooses its way
(transforms/dedupe/transform.py).
"""
from __future__ import annotations

import contextlib
import datetime as dt
import errno
import os
import sqlite3
from typing import NamedTuple
from collections.abc import Iterator, Mapping, Sequence

import apache_beam as beam

from pipeline.checks.inputs import InputInfo
from pipeline.checks.prior import Prior
from pipeline.outdir import space
from pipeline.runner import in_process, is_local, local_workers, one_worker
from pipeline.settings.job import Job
from pipeline.terminal.progress import report_interval_s
from transforms import schemas
from transforms.dedupe.claimfile import ClaimFile, claim_dir
from transforms.dedupe.distinct import LateRef
from transforms.dedupe.known import REUSED, FetchReused, KnownStores
from transforms.dedupe.transform import Dedupe
from transforms.embed.config import EmbedConfig, OutputConfig
from transforms.embed.transform import FAILED, PENDING, REQUESTS
from transforms.money.budget import Budget
from transforms.read.changes import CHANGES_SCHEMA
from transforms.read.parquet import Pull
from transforms.read.transform import CHANGED, ENTRIES, REJECTED, ReadDocuments, ReadPending, ViewRef
from transforms.requests import EMBEDDINGS, EmbedChunks, packed
from transforms.worker import runscoped
from transforms.write.docvectors import DocumentVectors, documents_schema
from transforms.write.transform import Output, WriteOutputs

REUSED_PER_TABLE = 1000


def streams(job: Job) -> bool:
    """Whether this run dedupes by claims, and so streams."""
    return is_local(job.opts) and not job.opts.doc_vectors


class Claiming(NamedTuple):
    """How a pipeline dedupes: by claims (STREAMING) or grouping; SHARED, the claim file of the
    local runner's worker processes when there are several."""
    streaming: bool
    scope: str
    shared: ClaimFile | None

    def late(self) -> list[LateRef]:
        """After the job: the rows whose text had been sent when they came, or that another
        process had claimed."""
        if self.shared is not None:
            return self.shared.late()
        claims = runscoped.get(self.scope, "claims")
        return claims.late if claims is not None else []


@contextlib.contextmanager
def claims_for(job: Job, scope: str) -> Iterator[Claiming]:
    """SCOPE's claims for one pipeline (the run id, or another for a counting pipeline). The
    claim file lives in a temporary directory of the driver's (a local disk: SQLite's locks),
    and it and the in-process claims go when the pipeline is done."""
    streaming = streams(job)
    with contextlib.ExitStack() as stack:
        stack.callback(runscoped.discard, scope)
        shared = None
        if streaming and not in_process(job.opts):
            shared = _claim_file(stack.enter_context(claim_dir()))
            stack.callback(shared.close)
        yield Claiming(streaming, scope, shared)


def _claim_file(folder: str) -> ClaimFile:
    """The claim file in FOLDER; a full disk there is an OSError naming it (SQLite says "disk
    I/O error" when it cannot grow its shared memory file)."""
    try:
        return ClaimFile.create(os.path.join(folder, "claims.sqlite"))
    except sqlite3.Error as exc:
        if (space.free_bytes(folder) or 0) >= space.MARGIN:
            raise
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), folder) from exc


def _without_text(entry):
    sha, (_, n_tokens, ref) = entry
    return sha, ("", n_tokens, ref)


def _known_stores(job: Job, prior: Prior, scope: str) -> KnownStores:
    return KnownStores(scope, job.model.name, job.dimensions, prior.known, prior.journal)


def _spread(job: Job, claiming: Claiming) -> bool | Pull:
    """How the input is shared among workers: none with one; pulled from the claim file by the
    local runner's worker processes; else the runner's split of reshuffled row groups."""
    if one_worker(job.opts):
        return False
    if claiming.shared is not None:
        return Pull(claiming.shared, local_workers(job.opts))
    return True


def _read(job: Job, info: InputInfo, prior: Prior, duplicate_ids: Mapping[str, int], claiming: Claiming,
          progress: bool) -> beam.PTransform:
    """The corpus's documents that need work against the view; without --input, the view's pending rows."""
    opts, s, scope = job.opts, job.settings, claiming.scope
    spread = _spread(job, claiming)
    if not opts.input:
        return ReadPending(prior.pending, info.columns, [f.name for f in info.kept_fields], spread)
    return ReadDocuments(info.files, info.partition_mappings, opts.id_column, opts.text_column, job.keep_columns,
                         job.split, duplicate_ids, ViewRef(prior.docindex, job.signature, scope, job.other_signature),
                         (opts.output, job.run_id, report_interval_s(s.embed)) if progress else None, spread,
                         info.stamp_map)


def _dedupe(job: Job, prior: Prior, claiming: Claiming) -> Dedupe:
    return Dedupe(_known_stores(job, prior, claiming.scope), claiming.scope, claiming.streaming, claiming.shared)


def packed_requests(p: beam.Pipeline, job: Job, info: InputInfo, prior: Prior = Prior(), *,
                    duplicate_ids: Mapping[str, int], claiming: Claiming, count_only: bool = False):
    """Read -> Dedupe -> Pack, what `plan` and the exact preflight count: (rejected rows, changed
    documents, reused (TextItem, ReuseRef) pairs or None, requests). COUNT_ONLY drops the texts
    before they are grouped. CLAIMING's scope names the in-process state of a pipeline
    (transforms/worker/runscoped.py): another than the run's, whose claims must not be its."""
    read = p | "Read" >> _read(job, info, prior, duplicate_ids, claiming, False)
    entries = read[ENTRIES] | "WithoutText" >> beam.Map(_without_text) if count_only else read[ENTRIES]
    s = job.settings
    deduped, requests = packed(entries, _dedupe(job, prior, claiming), job.model, s.pack.fill_target,
                               s.pack.max_open_requests)
    return read[REJECTED], read[CHANGED], deduped.get(REUSED), requests


def _journal_request_rows(rows: Sequence[dict]) -> list[dict]:
    return [{**r, "started_at": dt.datetime.fromisoformat(r["started_at"])} for r in rows]


def build(p: beam.Pipeline, job: Job, info: InputInfo, prior: Prior, run_dir: str, *,
          duplicate_ids: Mapping[str, int], claiming: Claiming, budget: Budget) -> None:
    """The job; its outputs go to RUN_DIR (DIR's history of this run)."""
    opts, model, s, codec = job.opts, job.model, job.settings, job.codec
    meta = schemas.metadata(model.name, job.dimensions, job.run_id)
    kept = info.kept_fields
    emb_schema = schemas.embeddings(job.dimensions, kept, meta, job.chunk_text)
    pending_schema = schemas.pending(kept, meta)
    read = p | "Read" >> _read(job, info, prior, duplicate_ids, claiming, True)
    output = OutputConfig(job.run_id, opts.output, emb_schema, pending_schema, kept, report_interval_s(s.embed))
    embed = EmbedConfig(job.service, budget, output, s.split.boundary_window, _known_stores(job, prior, job.run_id))
    # the library's step (embedpipe.EmbedTexts runs it too), with the CLI's Dedupe
    out = read[ENTRIES] | "EmbedChunks" >> EmbedChunks(_dedupe(job, prior, claiming), model, s.pack.fill_target,
                                                       s.pack.max_open_requests, embed)
    rejected, changed, reused = read[REJECTED], read[CHANGED], out.get(REUSED)

    embeddings, request_rows = out[EMBEDDINGS], out[REQUESTS]
    outputs = {"Embeddings": (embeddings, Output("embeddings", emb_schema)),
               "Pending": (out[PENDING], Output("pending", pending_schema)),
               "Changes": (changed, Output("changes", CHANGES_SCHEMA))}
    if reused is not None:
        reused_tables_ = reused | "FetchReused" >> FetchReused(model.name, job.run_id, emb_schema, kept,
                                                               dt.datetime.now(dt.UTC), REUSED_PER_TABLE)
        # files of their own: a Flatten with the sent vectors is held whole on the local runner
        outputs["Reused"] = reused_tables_, Output("embeddings", emb_schema, part="reused")
        if opts.doc_vectors:
            embeddings = (embeddings, reused_tables_) | "AllEmbeddings" >> beam.Flatten()
        journaled = p | "JournaledRequests" >> beam.Create(_journal_request_rows(prior.journal_requests))
        request_rows = (request_rows, journaled) | "AllRequests" >> beam.Flatten()
    outputs["Requests"] = request_rows, Output("requests", schemas.REQUESTS, rows=True)
    outputs["Failed"] = ((rejected, out[FAILED]) | "AllFailed" >> beam.Flatten(),
                         Output("failed", schemas.FAILED, rows=True, extra={"run_id": job.run_id}))
    if opts.doc_vectors:
        outputs["Documents"] = (embeddings | "DocumentVectors" >> DocumentVectors(model.name, job.run_id),
                                Output("documents", documents_schema(job.dimensions, meta), rows=True))
    ({label: pcoll for label, (pcoll, _) in outputs.items()}
     | "Write" >> WriteOutputs(run_dir, job.run_id, codec, {label: o for label, (_, o) in outputs.items()}))

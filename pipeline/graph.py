"""The job's Beam graph: Read (only what changed against DIR's view) -> Split -> Dedupe ->
(reuse what any store paid for) -> Pack -> Embed -> Write, into the run's directory of DIR's
history; the commit after the job (pipeline/outdir) makes it the current view.

On the local runner in one process, a run streams: texts and vectors go from Read to Write
in one fused stage and nothing large crosses a stage boundary (the FnApiRunner holds such a
PCollection in memory whole); the view's document index and the known texts are indexed by
digest in the process. --doc-vectors and runners with several worker processes group by text
instead (transforms/dedupe/distinct.py says why).
"""
from __future__ import annotations

import datetime as dt
from typing import Mapping, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions

from pipeline.checks.inputs import InputInfo
from pipeline.checks.prior import Prior
from pipeline.runner import is_local
from pipeline.settings.job import Job
from transforms import schemas
from transforms.dedupe.distinct import ChunkEntries, GroupDistinctTexts, SealClaims, SealReused, StreamDistinctTexts
from transforms.dedupe.known import REUSED, AntiJoinKnown, FetchReused, KnownStores, ReuseKnownStream
from transforms.embed.transform import FAILED, PENDING, REQUESTS, EmbedConfig, EmbedRequests
from transforms.pack import PackRequests
from transforms.read.changes import CHANGES_SCHEMA
from transforms.read.split import SplitConfig
from transforms.read.transform import CHANGED, REJECTED, ReadDocuments, ReadPending, ViewRef
from transforms.write.docvectors import DocumentVectors, documents_schema
from transforms.write.transform import WriteRows, WriteTables

REUSED_PER_TABLE = 1000


def streams(job: Job) -> bool:
    """Whether this run can dedupe in one process (StreamDistinctTexts) and so stream."""
    in_process = job.opts.view_as(DirectOptions).direct_running_mode != "multi_processing"
    return is_local(job.opts) and in_process and not job.opts.doc_vectors


def _without_text(entry):
    sha, (_, n_tokens, ref) = entry
    return sha, ("", n_tokens, ref)


def _known_stores(job: Job, prior: Prior, scope: str) -> KnownStores:
    return KnownStores(scope, job.model.name, job.dimensions, prior.known, prior.journal)


def packed_requests(p: beam.Pipeline, job: Job, info: InputInfo, prior: Prior = Prior(), *,
                    duplicate_ids: Mapping[str, int], streaming: bool, progress: bool = False,
                    count_only: bool = False, scope: str | None = None):
    """Read -> Split -> Dedupe -> (reuse known) -> Pack, shared by `run` and `plan`: (rejected
    rows or None, changed documents, reused (TextItem, ReuseRef) pairs or None,
    requests). COUNT_ONLY drops the texts before they are grouped (plan and the exact
    preflight only count). SCOPE names the in-process state of a pipeline
    (transforms/worker/runscoped.py): the run id, or another for a counting pipeline, whose claims
    must not be the run's."""
    opts, model, s = job.opts, job.model, job.settings
    scope = scope or job.run_id
    rejected = None
    if not opts.input:
        read = p | "ReadPending" >> ReadPending(prior.pending, info.columns, [f.name for f in info.kept_fields])
        entries = read["entries"]
    else:
        read = p | "Read" >> ReadDocuments(info.files, info.partition_mappings, opts.id_column,
                                           opts.text_column, job.keep_columns,
                                           SplitConfig(max_tokens=model.chunk_tokens,
                                                       overlap_tokens=s.split.overlap_tokens,
                                                       boundary_window=s.split.boundary_window),
                                           duplicate_ids, ViewRef(prior.docindex, job.signature, scope),
                                           (opts.output, job.run_id, s.embed.progress_interval_s) if progress else None)
        rejected = read[REJECTED]
        entries = read["docs"] | "Chunks" >> ChunkEntries()
    if count_only:
        entries = entries | "WithoutText" >> beam.Map(_without_text)
    items = entries | "Dedupe" >> (StreamDistinctTexts(scope) if streaming else GroupDistinctTexts())
    reused = None
    if prior.reuses and streaming:
        joined = items | "ReuseKnown" >> ReuseKnownStream(_known_stores(job, prior, scope))
        items, reused = joined["items"], joined[REUSED] | "SealReused" >> SealReused(scope)
    elif prior.reuses:
        joined = items | "AntiJoinKnown" >> AntiJoinKnown(model.name, job.dimensions, prior.known, prior.journal)
        items, reused = joined.items, joined[REUSED]
    requests = items | "PackRequests" >> PackRequests(model.max_inputs_per_request, model.request_tokens,
                                                      s.pack.fill_target, s.pack.max_open_requests)
    if streaming:
        requests = requests | "SealClaims" >> SealClaims(scope)
    return rejected, read[CHANGED], reused, requests


def _journal_request_rows(rows: Sequence[dict]) -> list[dict]:
    return [{**r, "started_at": dt.datetime.fromisoformat(r["started_at"])} for r in rows]


def build(p: beam.Pipeline, job: Job, info: InputInfo, prior: Prior, run_dir: str, *,
          duplicate_ids: Mapping[str, int], streaming: bool, fits: bool,
          balance_before: float | None, spendable_rub: float | None, price_per_token_rub: float,
          margin: float) -> None:
    """The job; its outputs go to RUN_DIR (DIR's history of this run)."""
    opts, model, s = job.opts, job.model, job.settings
    meta = schemas.metadata(model.name, job.dimensions, job.run_id)
    kept = info.kept_fields
    emb_schema = schemas.embeddings(job.dimensions, kept, meta)
    pending_schema = schemas.pending(kept, meta)
    rejected, changed, reused, requests = packed_requests(p, job, info, prior, duplicate_ids=duplicate_ids,
                                                          streaming=streaming, progress=True)
    embed_cfg = EmbedConfig(
        base_url=opts.base_url, account_segment=opts.account_segment, key_source=job.key_source,
        model=model.name, dimensions=opts.dimensions, expected_dims=job.dimensions, run_id=job.run_id,
        output_dir=opts.output, retry=job.retry, pool_size=s.client.pool_size,
        encoding_format=s.client.encoding_format, max_decoding=s.client.max_decoding,
        max_in_flight=s.embed.max_in_flight, initial_in_flight=s.embed.initial_in_flight,
        balance_before=balance_before, spendable_rub=spendable_rub,
        price_per_token_rub=price_per_token_rub,
        price_margin=margin, learned_margin=1 / model.safety_factor,
        balance_poll_s=s.budget.balance_poll_s,
        allow_partial=opts.allow_partial, boundary_window=s.split.boundary_window,
        progress_interval_s=s.embed.progress_interval_s,
        requests_per_minute=s.rate_limits.requests_per_minute,
        tokens_per_minute=s.rate_limits.tokens_per_minute, embeddings_schema=emb_schema,
        pending_schema=pending_schema, kept=kept, known=_known_stores(job, prior, job.run_id), fits=fits)
    out = requests | "Embed" >> EmbedRequests(embed_cfg)

    embeddings, request_rows = out.embeddings, out[REQUESTS]
    codec = job.codec
    if reused is not None:
        reused_tables_ = reused | "FetchReused" >> FetchReused(model.name, job.run_id, emb_schema, kept,
                                                               dt.datetime.now(dt.timezone.utc), REUSED_PER_TABLE)
        # files of their own: a Flatten with the sent vectors is held whole on the local runner
        reused_tables_ | "WriteReused" >> WriteTables(run_dir, "embeddings", job.run_id, emb_schema, codec,
                                                      part="reused")
        if opts.doc_vectors:
            embeddings = (embeddings, reused_tables_) | "AllEmbeddings" >> beam.Flatten()
        journaled = p | "JournaledRequests" >> beam.Create(_journal_request_rows(prior.journal_requests))
        request_rows = (request_rows, journaled) | "AllRequests" >> beam.Flatten()

    out.embeddings | "WriteEmbeddings" >> WriteTables(run_dir, "embeddings", job.run_id, emb_schema, codec)
    request_rows | "WriteRequests" >> WriteRows(run_dir, "requests", job.run_id, schemas.REQUESTS, codec)
    failed = out[FAILED] if rejected is None else (rejected, out[FAILED]) | "AllFailed" >> beam.Flatten()
    (failed
     | "WriteFailed" >> WriteRows(run_dir, "failed", job.run_id, schemas.FAILED, codec,
                                  extra={"run_id": job.run_id}))
    out[PENDING] | "WritePending" >> WriteTables(run_dir, "pending", job.run_id, pending_schema, codec)
    changed | "WriteChanges" >> WriteRows(run_dir, "changes", job.run_id, CHANGES_SCHEMA, codec)
    if opts.doc_vectors:
        (embeddings | "DocumentVectors" >> DocumentVectors(model.name, job.run_id)
         | "WriteDocuments" >> WriteRows(run_dir, "documents", job.run_id,
                                         documents_schema(job.dimensions, meta), codec))

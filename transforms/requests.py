"""The embedding step both the CLI's graph (pipeline/graph.py: Read -> EmbedChunks -> Write)
and the library (embedpipe.EmbedTexts: ReadRows -> EmbedChunks -> dicts) run: chunk entries ->
distinct texts (a Dedupe: the CLI's, transforms/dedupe/transform.py, or the library's,
transforms/dedupe/inflight.StoreDedupe) -> packed requests within the model's caps -> each text
with every row that shares it (the CLI's seal step; the library's claims are sealed by Embed)
-> Embed. `plan` runs it without Embed
(packed)."""
from __future__ import annotations

import apache_beam as beam

from service.catalog import ModelSpec
from transforms.dedupe.inflight import StoreDedupe
from transforms.dedupe.transform import ITEMS, Dedupe
from transforms.embed.config import EmbedConfig
from transforms.embed.transform import FAILED, PENDING, REQUESTS, EmbedRequests
from transforms.pack import PackRequests

EMBEDDINGS = "embeddings"


def packed(entries, dedupe: Dedupe | StoreDedupe, model: ModelSpec, fill_target: float, max_open: int):
    """(Dedupe's outputs, requests): the requests' labels are the CLI's, in the caller's scope.
    The CLI's Dedupe seals the packed requests; the library's StoreDedupe has no seal step
    (Embed seals each request as it submits it)."""
    deduped = entries | "Dedupe" >> dedupe
    seal = dedupe.seal() if isinstance(dedupe, Dedupe) else None
    return deduped, pack(deduped[ITEMS], seal, model, fill_target, max_open)


def pack(items, seal: beam.PTransform | None, model: ModelSpec, fill_target: float, max_open: int):
    """Distinct texts -> requests within the model's caps, sealed by SEAL when there is one."""
    requests = items | "PackRequests" >> PackRequests(model.max_inputs_per_request, model.request_tokens,
                                                      fill_target, max_open)
    return requests if seal is None else requests | "SealClaims" >> seal


class EmbedChunks(beam.PTransform):
    """(text_sha256, (text, n_tokens, ChunkRef)) -> {EMBEDDINGS: tables, REQUESTS: dicts,
    FAILED: Rejected, PENDING: tables, and what else DEDUPE gives (the CLI's `reused`)}."""

    def __init__(self, dedupe: Dedupe | StoreDedupe, model: ModelSpec, fill_target: float, max_open: int,
                 embed: EmbedConfig):
        super().__init__()
        self._dedupe, self._model, self._pack, self._embed = dedupe, model, (fill_target, max_open), embed

    def expand(self, entries):
        deduped, requests = packed(entries, self._dedupe, self._model, *self._pack)
        out = requests | "Embed" >> EmbedRequests(self._embed)
        others = {tag: pcoll for tag, pcoll in deduped.items() if tag != ITEMS}
        return {EMBEDDINGS: out.embeddings, REQUESTS: out[REQUESTS], FAILED: out[FAILED], PENDING: out[PENDING],
                **others}

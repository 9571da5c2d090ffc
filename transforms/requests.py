"""The job's middle, shared by the CLI's graph (pipeline/graph.py) and the library
(embedpipe.EmbedTexts): chunk entries -> distinct texts (Dedupe) -> packed requests within the
model's caps (PackRequests) -> each text with every row that shares it (Dedupe.seal). The
library puts a step of its own between Dedupe and Pack (pack alone)."""
from __future__ import annotations

from service.catalog import ModelSpec
from transforms.dedupe.transform import ITEMS, Dedupe
from transforms.pack import PackRequests


def packed(entries, dedupe: Dedupe, model: ModelSpec, fill_target: float, max_open: int):
    """(Dedupe's outputs, requests): the requests' labels are the CLI's, in the caller's scope."""
    deduped = entries | "Dedupe" >> dedupe
    return deduped, pack(deduped[ITEMS], dedupe, model, fill_target, max_open)


def pack(items, dedupe: Dedupe, model: ModelSpec, fill_target: float, max_open: int):
    """Dedupe's distinct texts -> sealed requests within the model's caps."""
    return (items
            | "PackRequests" >> PackRequests(model.max_inputs_per_request, model.request_tokens, fill_target, max_open)
            | "SealClaims" >> dedupe.seal())

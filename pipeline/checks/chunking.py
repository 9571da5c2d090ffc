"""A view's chunking (chunk tokens, overlap, boundary window): part of what it is, like its
model. A run that cuts otherwise is refused on a living DIR, unless it switches DIR to the
new chunks (pipeline/checks/switching.py): a view keeps one chunking, so a search never ranks
passages of two sizes against each other.

A view's manifest records its chunking. One committed before manifests did was cut at its
model's limit; its overlap and boundary window are found again from its signature
(transforms/read/changes.py), which they shaped: the run's own first, then every overlap up
to a quarter of the chunk with the run's window and the default one (a few thousand hashes,
milliseconds).
"""
from __future__ import annotations

from pipeline.outdir.view import View
from service.catalog import ModelSpec
from service.tokenizer import ENCODING_NAME
from transforms.read.changes import Chunking, signature

DEFAULT_WINDOW = 0.1   # configs/pipeline.yaml's split.boundary_window as it shipped


def view_chunking(view: View, model: ModelSpec, hint: Chunking) -> Chunking | None:
    """VIEW's chunking (MODEL: the view's model; HINT: the run's chunking, tried first for a
    view that does not record it); None when its signature matches none."""
    if view.chunking is not None:
        return view.chunking
    limit = model.chunk_tokens
    tried = [Chunking(limit, hint.overlap_tokens, hint.boundary_window)]
    tried += [Chunking(limit, overlap, window) for window in dict.fromkeys((hint.boundary_window, DEFAULT_WINDOW))
              for overlap in range(limit // 4 + 1)]
    return next((c for c in tried for text in (False, True)
                 if signature(ENCODING_NAME, c, view.kept, text).hex() == view.signature), None)


def describe(chunking: Chunking | None) -> str:
    """`300-token chunks overlapping by 30 (--chunk-tokens 300 --overlap-tokens 30)`."""
    if chunking is None:
        return "chunks of a size its manifest does not say"
    words = f"{chunking.chunk_tokens}-token chunks"
    flags = f"--chunk-tokens {chunking.chunk_tokens}"
    if chunking.overlap_tokens:
        words += f" overlapping by {chunking.overlap_tokens}"
        flags += f" --overlap-tokens {chunking.overlap_tokens}"
    if chunking.boundary_window != DEFAULT_WINDOW:
        flags += f", split.boundary_window {chunking.boundary_window:g}"
    return f"{words} ({flags})"

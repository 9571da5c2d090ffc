"""What flows between the steps, as NamedTuples: the fields keep the code readable, and
Beam's FastPrimitivesCoder takes them (it pickles them: values that cross a shuffle pay for
that, which is why the steps before the GroupByKey work on whole tables and documents)."""
from __future__ import annotations

from typing import Any, NamedTuple


class ChunkRef(NamedTuple):
    """One row's use of a chunk text: where in which document it sits."""
    doc_id: str
    chunk_index: int
    chunk_count: int
    token_start: int
    token_end: int
    n_tokens: int
    kept: tuple[Any, ...]  # values of --keep-columns, in that order


class TextItem(NamedTuple):
    """One distinct chunk text of the run and every row that shares it (in-run dedup)."""
    text_sha256: str
    text: str
    n_tokens: int
    refs: tuple[ChunkRef, ...]
    claim: int = 0  # the library's: the bundle whose claim it is (transforms/dedupe/inflight.py); 0: none


class StoredItem(NamedTuple):
    """A row whose text the store of paid texts holds (transforms/dedupe/inflight.py): it goes
    down the same path as the texts to send, so every vector comes out of one step."""
    text_sha256: str
    text: str
    n_tokens: int
    refs: tuple[ChunkRef, ...]


class Request(tuple[Any, ...]):
    """The TextItems of one embeddings request (transforms/worker/coders.py sizes it cheaply), or
    StoredItems to take from the store."""
    __slots__ = ()


class Row(dict[str, Any]):
    """A row of the library's outputs: a plain dict, typed so that its PCollections get a coder
    that sizes a row from its fields (transforms/worker/coders.py) instead of pickling it."""


class Rejected(NamedTuple):
    """A row or chunk that will not be embedded, with a short reason code."""
    doc_id: str | None
    chunk_index: int | None
    reason: str
    detail: str

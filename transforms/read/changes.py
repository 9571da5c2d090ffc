"""Which documents a run works on: each input row against DIR's current view (no Beam here).

A document's version is its fingerprint: sha256 of the view's signature (tokenizer, chunk
limit, overlap, boundary window, kept columns: what shapes its chunks and rows), its text and
its kept values. The view's document index holds, per id, the version it serves, the version
being built while an edited document is not complete (`target`), and the chunk indexes of the
version being built that are still pending (`todo`; none when complete).

- added: no version in DIR: every chunk.
- unchanged: the version DIR serves, complete: nothing (not even tokenised).
- resumed: the version DIR is building (served and incomplete, or the target): its todo chunks.
- edited: any other version: every chunk; texts DIR already holds are reused, not paid.
- rewritten: the version DIR serves, complete, but its rows were written with the text column
  and this run writes them without it, or the other way round (a view written before rows
  carried their text): every chunk, every vector reused; counted among the unchanged.
"""
from __future__ import annotations

import hashlib
import struct
from typing import Any, NamedTuple
from collections.abc import Mapping, Sequence

import pyarrow as pa

from transforms.read.parquet import open_parquet, parquet_file
from transforms.schemas import required
from transforms.worker.keyindex import KeyIndex, key16

ADDED, EDITED, RESUMED, UNCHANGED, REWRITTEN = "added", "edited", "resumed", "unchanged", "rewritten"
CHANGES = (ADDED, EDITED, RESUMED, UNCHANGED, REWRITTEN)
FINGERPRINT = pa.binary(16)

DOCINDEX = pa.schema([
    required("doc_id", pa.string()),
    pa.field("served", FINGERPRINT),            # the version readers see (rows or a failure)
    pa.field("target", FINGERPRINT),            # a newer version, not complete yet
    pa.field("todo", pa.list_(required("item", pa.int32()))),   # its chunks still pending
])

# One row per document a run worked on; the commit turns them into the next view.
CHANGES_SCHEMA = pa.schema([required("doc_id", pa.string()), required("change", pa.string()),
                            pa.field("fingerprint", FINGERPRINT)])


def changes_table(doc_ids: list[str], changes: list[str], fingerprints: Sequence[bytes | None]) -> pa.Table:
    """Change records (CHANGES_SCHEMA), a table at a time: one Beam element, not one a row."""
    return pa.Table.from_pydict({"doc_id": doc_ids, "change": changes, "fingerprint": fingerprints},
                                schema=CHANGES_SCHEMA)


class Chunking(NamedTuple):
    """What cuts a document into chunks: part of a view's identity, like its model (a change
    on a living DIR builds another view: pipeline/checks/switching.py)."""
    chunk_tokens: int
    overlap_tokens: int
    boundary_window: float

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any] | None) -> Chunking | None:
        """From a manifest or switch record (None when it does not say; other keys ignored)."""
        return cls(*(doc[k] for k in cls._fields)) if doc else None


def signature(tokenizer: str, chunking: Chunking, kept: Sequence[str], text: bool) -> bytes:
    """What makes the same text give other chunks or rows: a document read under another
    signature is done again. TEXT: its rows carry their chunks' text (a view written without
    them has the signature of text=False: its documents get their rows again, vectors reused)."""
    fields = (tokenizer, *chunking, tuple(kept)) + (("text",) if text else ())
    return hashlib.sha256(repr(fields).encode()).digest()


def fingerprint(sig: bytes, text: str | None, kept: tuple[Any, ...] = (), refusal: str | None = None) -> bytes:
    """A document version: its text and kept values under SIG; REFUSAL stands for a row that
    is refused whatever its text (a repeated id, bytes that are not UTF-8)."""
    h = hashlib.sha256(sig)
    if refusal is not None:
        h.update(b"\x01" + refusal.encode("utf-8", "surrogatepass"))
    elif text is None:
        h.update(b"\x02")
    else:   # two updates: joining would copy every document's text once more
        h.update(b"\x03")
        h.update(text.encode("utf-8", "surrogatepass"))
    h.update(b"\x00" + repr(kept).encode("utf-8", "surrogatepass"))
    return h.digest()[:16]


def counts(changed: Mapping[str, int], documents: int | None, removed: int) -> dict[str, int]:
    """The change counts of a run: CHANGED, distinct documents per change the run worked on;
    DOCUMENTS, distinct ids in its input (None: DIR's pending rows were the input)."""
    worked = {c: changed.get(c, 0) for c in (ADDED, EDITED, RESUMED)}
    unchanged = 0 if documents is None else documents - sum(worked.values())
    rewritten = changed.get(REWRITTEN, 0)   # among the unchanged; named only when there are some
    return {ADDED: worked[ADDED], EDITED: worked[EDITED], "removed": removed, UNCHANGED: unchanged,
            RESUMED: worked[RESUMED], **({REWRITTEN: rewritten} if rewritten else {})}


class Entry(NamedTuple):
    served: bytes | None
    target: bytes | None
    todo: tuple[int, ...] | None


def classify(entry: Entry | None, fp: bytes, other_fp: bytes | None = None) -> tuple[str, tuple[int, ...] | None]:
    """(change, the chunk indexes to send: None for all). OTHER_FP: the document's version
    under the signature with the other text setting (None: not computed; a caller computes it
    only for an edited document, see `rewritten`)."""
    if entry is None:
        return ADDED, None
    building = entry.target if entry.target is not None else entry.served
    if fp == building and entry.todo:
        return RESUMED, entry.todo
    if fp == entry.served and entry.target is None:
        return UNCHANGED, ()
    if other_fp is not None and classify(entry, other_fp)[0] == UNCHANGED:
        return REWRITTEN, None
    return EDITED, None


_HEAD = struct.Struct("<BI")   # which fingerprints are set, number of todo chunks
_NONE = bytes(16)


class DocIndex:
    """The view's document index in one process: ~60 bytes a document (KeyIndex)."""

    def __init__(self, path: str | None):
        self._index = KeyIndex()
        if path is None:
            return
        with open_parquet(path) as fh:
            parquet = parquet_file(fh)
            for g in range(parquet.metadata.num_row_groups):
                table = parquet.read_row_group(g)
                for doc_id, served, target, todo in zip(*(table.column(c).to_pylist() for c in DOCINDEX.names), strict=True):
                    self._index.put(key16(doc_id), _pack(Entry(served, target, tuple(todo) if todo else None)))

    def __len__(self) -> int:
        return len(self._index)

    def get(self, doc_id: str) -> Entry | None:
        row = self._index.get(key16(doc_id))
        return None if row is None else _unpack(row)


def _pack(e: Entry) -> bytes:
    flags = (e.served is not None) | (e.target is not None) << 1
    todo = e.todo or ()
    return (_HEAD.pack(flags, len(todo)) + (e.served or _NONE) + (e.target or _NONE)
            + struct.pack(f"<{len(todo)}i", *todo))


def _unpack(row: bytes) -> Entry:
    flags, n = _HEAD.unpack_from(row)
    at = _HEAD.size
    served, target = row[at:at + 16], row[at + 16:at + 32]
    todo = struct.unpack_from(f"<{n}i", row, at + 32) if n else None
    return Entry(served if flags & 1 else None, target if flags & 2 else None, todo)

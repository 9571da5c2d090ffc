"""PaidTexts: what one worker process was answered for a pipeline's texts (no Beam here).

ServiceTextEmbeddings sees one batch at a time; a text met in an earlier batch, or in a batch
another thread of the process is sending, must not be paid again. Each distinct text (by
digest) is claimed by the first batch that meets it: later batches take its vector (a claim
still open: they wait for it, after sending their own texts). Only a vector is shared, as with
EmbedTexts's claims (transforms/dedupe/inflight.py): a text whose request ended without one
(a dead letter, a text the budget stopped), raised, or never left is released, and a batch
that waited for it claims it again and sends it itself. A claim is settled by its own request
when that ends, never by the batch: when one request of a batch fails, a text still on the
wire in another stays claimed, so no batch pays for it a second time meanwhile.

Why a second class and not InFlightClaims: those hold rows that stream into a bundle and join
a claim until its request leaves, and a row blocks on a text in flight. A batch here claims
all its texts at once and sends its own before it waits: blocking on one text first, as a row
does, would hold its other claims unsent meanwhile, and batches meeting them would pay them
too. And the vectors are kept here: without a store, MLTransform must still give a text met
in any earlier batch its vector, read back by offset (a store's entry is read whole, ~12 MB
for one vector of a 2048-input request).

Memory stays flat in the number of texts: vectors go to a temporary file of the process's
(4 bytes a dimension), and a KeyIndex keeps, per text, where its vector lies, its tokens and
the request that paid for it (~80 bytes).
"""
from __future__ import annotations

import concurrent.futures as cf
import os
import struct
import tempfile
import threading
from typing import NamedTuple
from collections.abc import Iterable

import numpy as np

from transforms.worker.keyindex import KeyIndex, key16

_ROW = struct.Struct("<QI")   # the vector's offset in the file, its text's tokens; the request id follows


class Answer(NamedTuple):
    vector: np.ndarray | None    # float32; None when not embedded
    n_tokens: int
    request_id: str | None
    error: str | None = None
    detail: str | None = None


class PaidTexts:
    def __init__(self, dims: int):
        self._dims = dims
        self._lock = threading.Lock()
        self._index = KeyIndex()
        self._file = tempfile.TemporaryFile(prefix="embedpipe-paid-")
        self._end = 0
        self._open: dict[str, cf.Future[Answer | None]] = {}

    def claim(self, shas: Iterable[str]) -> tuple[dict[str, Answer], dict[str, cf.Future[Answer | None]], list[str]]:
        """SHAS -> (answers held, futures of the texts other batches are sending, texts claimed for
        the caller to send: it must `settle` or `release` each one). A future's result is the
        answer with its vector, or None: it ended without one, claim it again."""
        held, waiting, mine = {}, {}, []
        with self._lock:
            for sha in shas:
                if (row := self._index.get(key16(sha))) is not None:
                    held[sha] = row
                elif sha in self._open:
                    waiting[sha] = self._open[sha]
                else:
                    self._open[sha] = cf.Future()
                    mine.append(sha)
        return {sha: self._read(row) for sha, row in held.items()}, waiting, mine

    def settle(self, sha: str, answer: Answer) -> None:
        """SHA's request ended with ANSWER: kept if it has a vector; the claim is released."""
        if answer.vector is not None:
            data = np.ascontiguousarray(answer.vector, dtype=np.float32).tobytes()
            with self._lock:
                at, self._end = self._end, self._end + len(data)
            os.pwrite(self._file.fileno(), data, at)   # its own place: no lock needed while writing
            row = _ROW.pack(at, answer.n_tokens) + (answer.request_id or "").encode()
        with self._lock:
            if answer.vector is not None:
                self._index.put(key16(sha), row)
            future = self._open.pop(sha, None)
        if future is not None:
            future.set_result(answer if answer.vector is not None else None)

    def release(self, sha: str) -> None:
        """SHA's request raised, or never left (if SHA is still claimed): a batch waiting for it claims it again."""
        with self._lock:
            future = self._open.pop(sha, None)
        if future is not None:
            future.set_result(None)

    def _read(self, row: bytes) -> Answer:
        at, n_tokens = _ROW.unpack_from(row)
        data = os.pread(self._file.fileno(), self._dims * 4, at)
        return Answer(np.frombuffer(data, dtype=np.float32), n_tokens, row[_ROW.size:].decode() or None)

"""PaidTexts: what one worker process was answered for a pipeline's texts (no Beam here).

ServiceTextEmbeddings sees one batch at a time; a text met in an earlier batch, or in a batch
another thread of the process is sending, must not be paid again. Each distinct text (by
digest) is claimed by the first batch that meets it: later batches take its answer (a claim
still open: they wait for it, after sending their own texts). An answer without a vector (a
dead letter, a text the budget stopped) is not kept: a later batch may try again.

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
        self._open: dict[str, cf.Future] = {}

    def claim(self, shas: Iterable[str]) -> tuple[dict[str, Answer], dict[str, cf.Future], list[str]]:
        """SHAS -> (answers held, answers other batches are waiting for, texts claimed for the caller
        to send: it must `settle` each one, with an answer or an error)."""
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
            future.set_result(answer)

    def _read(self, row: bytes) -> Answer:
        at, n_tokens = _ROW.unpack_from(row)
        data = os.pread(self._file.fileno(), self._dims * 4, at)
        return Answer(np.frombuffer(data, dtype=np.float32), n_tokens, row[_ROW.size:].decode() or None)

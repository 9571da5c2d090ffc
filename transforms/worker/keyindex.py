"""KeyIndex: 16-byte keys (digests) -> byte rows, in ~32 bytes a key plus its row.

What a run must remember per text or per row (the streaming dedupe's sent texts, the rows an
earlier run delivered, the vectors earlier runs hold) grows with the corpus; a dict of bytes
keys and values took ~160 bytes an entry. Here the keys are sorted in two uint64 arrays and
the rows lie back to back in one bytearray; the latest keys wait in a small dict until
MERGE_EVERY of them are merged into the arrays. Most lookups are of keys not there (every new
text's): a bitmap of 24 bits of each key answers those without a search. Not thread-safe.
"""
from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import numpy as np

_LENGTH = struct.Struct("<I")   # a row holds a doc_id, which has no length limit
_HALVES = struct.Struct("<QQ")


def key16(text: str) -> bytes:
    """The key of a hex sha256 (its first 16 bytes) or of any other string (its sha256's)."""
    if len(text) == 64:
        try:
            return bytes.fromhex(text)[:16]
        except ValueError:
            pass
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()[:16]


class KeyIndex:
    MERGE_EVERY = 4096
    _SEEN_BITS = 24

    def __init__(self) -> None:
        self._seen = bytearray(1 << (self._SEEN_BITS - 3))   # 2 MB
        self._hi = np.empty(0, np.uint64)
        self._lo = np.empty(0, np.uint64)
        self._at = np.empty(0, np.int64)     # where each key's row starts in _rows
        self._recent: dict[bytes, int] = {}
        self._rows = bytearray()

    def __len__(self) -> int:
        return len(self._hi) + len(self._recent)

    def __contains__(self, key: bytes) -> bool:
        return self._where(key) is not None

    def put(self, key: bytes, row: bytes = b"") -> None:
        """Store ROW under KEY (replacing what KEY held)."""
        at = len(self._rows)
        self._rows += _LENGTH.pack(len(row)) + row
        byte, bit = self._bit(key)
        if self._seen[byte] & bit and key not in self._recent and (i := self._position(key)) is not None:
            self._at[i] = at   # the row it replaces stays behind in _rows, unread
            return
        self._seen[byte] |= bit
        self._recent[key] = at
        if len(self._recent) >= self.MERGE_EVERY:
            self._merge()

    def discard(self, keys: Iterable[bytes]) -> None:
        """Forget KEYS (16 bytes each; those not held are ignored). Their rows stay behind in
        _rows, unread, as a replaced row does: this is for the rare undo (a failed bundle's)."""
        drop = [i for key in keys if self._recent.pop(key, None) is None and (i := self._position(key)) is not None]
        if drop:
            self._hi, self._lo, self._at = np.delete(self._hi, drop), np.delete(self._lo, drop), np.delete(self._at, drop)

    def get(self, key: bytes) -> bytes | None:
        at = self._where(key)
        if at is None:
            return None
        (length,) = _LENGTH.unpack_from(self._rows, at)
        return bytes(self._rows[at + _LENGTH.size:at + _LENGTH.size + length])

    def _bit(self, key: bytes) -> tuple[int, int]:
        slot = int.from_bytes(key[:3], "little")
        return slot >> 3, 1 << (slot & 7)

    def _where(self, key: bytes) -> int | None:
        """Where KEY's row starts in _rows, or None."""
        byte, bit = self._bit(key)
        if not self._seen[byte] & bit:
            return None
        at = self._recent.get(key)
        if at is None and (i := self._position(key)) is not None:
            at = int(self._at[i])
        return at

    def _position(self, key: bytes) -> int | None:
        """KEY's index in the sorted arrays, or None."""
        hi, lo = (np.uint64(half) for half in _HALVES.unpack(key))
        i = int(np.searchsorted(self._hi, hi))
        while i < len(self._hi) and self._hi[i] == hi and self._lo[i] != lo:
            i += 1   # another key with the same first 8 bytes: next to it, in order
        return i if i < len(self._hi) and self._hi[i] == hi else None

    def _merge(self) -> None:
        halves = np.frombuffer(b"".join(self._recent), dtype="<u8").reshape(-1, 2)
        at = np.fromiter(self._recent.values(), np.int64, len(self._recent))
        order = np.argsort(halves[:, 0], kind="stable")
        hi, lo, at = halves[order, 0].astype(np.uint64), halves[order, 1].astype(np.uint64), at[order]
        where = np.searchsorted(self._hi, hi)   # sorted too: the merged keys stay sorted
        self._hi, self._lo = np.insert(self._hi, where, hi), np.insert(self._lo, where, lo)
        self._at = np.insert(self._at, where, at)
        self._recent.clear()

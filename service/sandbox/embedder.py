"""Deterministic, lexically meaningful vectors: the sandbox's stand-in for a real model.

A vector is the signed feature hashing of the text's lower-cased words (runs of letters,
digits and '_') and character 3-grams, salted with the model name, L2-normalised, float32.
Similar texts share most features, so their cosine is high; unrelated texts land near 0.
The hashes are fixed 64-bit mixes, never Python's salted hash(), so a vector depends only
on (model, text, dimensions), in every process.

`dimensions` shortens the model's default vector and renormalises it, as the
text-embedding-3 models do (their vectors are ordered by importance).

Speed: a batch is one array of code points; words, 3-grams, hashing and accumulation are
a few numpy calls per group of texts, with no Python loop over words or characters.
"""
from __future__ import annotations

import functools
import re
import zlib
from collections.abc import Sequence

import numpy as np

_NGRAM_WEIGHT = 0.5   # words carry more meaning than spelling; both count
_GROUP = 256          # texts accumulated at once: bounds the (texts x dims) float64 buffer
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)
_MIX = np.uint64(0xFF51AFD7ED558CCD)
_POW_PERIOD = 1024    # positions in a word beyond this reuse the multipliers (still deterministic)
_POWERS = np.cumprod(np.full(_POW_PERIOD, 0x100000001B3, dtype=np.uint64))   # wraps mod 2**64


@functools.cache
def _word_chars() -> np.ndarray:
    """Which Basic Multilingual Plane code points are word characters (regex \\w); code
    points beyond it (emoji, rare scripts) count as separators."""
    bmp = "".join(map(chr, range(0x10000)))
    kept = re.sub(r"\W", "\x00", bmp).encode("utf-32-le", "surrogatepass")
    return np.frombuffer(kept, dtype="<u4").astype(bool)


def _salt(model: str) -> np.uint64:
    return np.uint64(zlib.crc32(model.encode("utf-8")))


def _finish(h: np.ndarray, salt: np.uint64) -> np.ndarray:
    h ^= salt
    h ^= h >> np.uint64(33)
    h *= _MIX
    h ^= h >> np.uint64(29)
    return h


def _features(lows: list[str], salt: np.uint64) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, hash, weight) of every word and every 3-gram inside each text (none across texts)."""
    cps = np.frombuffer("".join(lows).encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    rows = np.repeat(np.arange(len(lows)), [len(s) for s in lows])
    n = cps.size
    # words: maximal runs of word characters within one text
    table = _word_chars()
    is_word = table.take(np.minimum(cps, 0xFFFF).astype(np.intp)) & (cps < 0x10000)
    starts = is_word.copy()
    starts[1:] &= ~is_word[:-1] | (rows[1:] != rows[:-1])
    idx = np.flatnonzero(is_word)
    word_of = np.cumsum(starts)[idx] - 1
    start_pos = np.flatnonzero(starts)
    pos = (idx - start_pos[word_of]) % _POW_PERIOD
    contrib = cps[idx] * _POWERS[pos]
    first = np.flatnonzero(starts[idx]) if idx.size else np.empty(0, dtype=np.int64)
    word_h = _finish(np.add.reduceat(contrib, first) if first.size else np.empty(0, np.uint64), salt)
    word_rows = rows[start_pos]
    # character 3-grams
    if n >= 3:
        inside = rows[:-2] == rows[2:]
        gram_h = _finish(((cps[:-2] * _M1) ^ (cps[1:-1] * _M2) ^ (cps[2:] * _M3))[inside], salt)
        gram_rows = rows[:-2][inside]
    else:
        gram_h, gram_rows = np.empty(0, np.uint64), np.empty(0, np.int64)
    weights = np.concatenate((np.ones(word_h.size), np.full(gram_h.size, _NGRAM_WEIGHT)))
    return np.concatenate((word_rows, gram_rows)), np.concatenate((word_h, gram_h)), weights


def _fallback(model: str, text: str, dims: int) -> np.ndarray:
    # No word and no 3-gram ("!", "a"): a vector seeded by the text itself, still deterministic.
    seed = zlib.crc32(text.encode("utf-8"), zlib.crc32(model.encode("utf-8")))
    return np.random.default_rng(seed).standard_normal(dims)


def _embed_group(model: str, texts: Sequence[str], dims: int, full: int) -> np.ndarray:
    lows = [t.lower() for t in texts]
    rows, feats, weights = _features(lows, _salt(model))
    signs = np.where((feats & np.uint64(1)) == 1, weights, -weights)
    cols = ((feats >> np.uint64(1)) % np.uint64(full)).astype(np.int64)
    # astype: with no feature at all, bincount answers an int array
    acc = np.bincount(rows * full + cols, weights=signs, minlength=len(lows) * full).astype(np.float64)
    vecs = acc.reshape(len(lows), full)[:, :dims]
    norms = np.linalg.norm(vecs, axis=1)
    for i in np.flatnonzero(norms == 0.0):
        vecs[i] = _fallback(model, texts[int(i)], full)[:dims]
        norms[i] = np.linalg.norm(vecs[i])
    return np.asarray(vecs / norms[:, None], dtype=np.float32)


def embed_batch(model: str, texts: Sequence[str], dims: int, full_dims: int | None = None) -> np.ndarray:
    """Vectors for TEXTS, shape (len(texts), DIMS), float32, unit norm. FULL_DIMS is the
    model's default length when DIMS shortens it (defaults to DIMS)."""
    full = full_dims or dims
    if not texts:
        return np.empty((0, dims), dtype=np.float32)
    return np.concatenate([_embed_group(model, texts[i:i + _GROUP], dims, full)
                           for i in range(0, len(texts), _GROUP)])


def embed_text(model: str, text: str, dims: int, full_dims: int | None = None) -> np.ndarray:
    """The vector the sandbox returns for TEXT under MODEL: float32, unit norm, length DIMS.

    Pass the model's default length as DIMS (service.catalog: ModelSpec.dimensions), or the
    request's `dimensions` as DIMS with the default length as FULL_DIMS."""
    return embed_batch(model, [text], dims, full_dims).reshape(dims)

"""Deterministic, lexically meaningful vectors: the sandbox's stand-in for a real model.

A vector is the signed feature hashing of the text's lower-cased word unigrams and
character 3-grams, salted with the model name, L2-normalised, float32. Similar texts share
most features, so their cosine is high; unrelated texts land near 0. Hashes are stable
(crc32 for words, a fixed 64-bit mix for 3-grams), never Python's salted hash(), so a
vector depends only on (model, text, dimensions) in every process.

`dimensions` shortens the model's default vector and renormalises it, as the
text-embedding-3 models do (their vectors are ordered by importance).
"""
from __future__ import annotations

import functools
import re
import zlib

import numpy as np

_WORD = re.compile(r"\w+")
_NGRAM_WEIGHT = 0.5   # words carry more meaning than spelling; both count
_M1, _M2, _M3 = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xC2B2AE3D27D4EB4F), np.uint64(0x165667B19E3779F9)
_MIX = np.uint64(0xFF51AFD7ED558CCD)


@functools.lru_cache(maxsize=64)
def _salt(model: str) -> int:
    return zlib.crc32(model.encode("utf-8"))


@functools.lru_cache(maxsize=1 << 18)
def _word_feature(salt: int, word: str) -> int:
    return zlib.crc32(word.encode("utf-8"), salt)


def _ngram_features(text: str, salt: int) -> np.ndarray:
    cps = np.frombuffer(text.encode("utf-32-le"), dtype="<u4").astype(np.uint64)
    if cps.size < 3:
        return np.empty(0, dtype=np.uint64)
    h = (cps[:-2] * _M1) ^ (cps[1:-1] * _M2) ^ (cps[2:] * _M3) ^ np.uint64(salt)
    h ^= h >> np.uint64(33)
    h *= _MIX
    h ^= h >> np.uint64(29)
    return h


def _fallback(model: str, text: str, dims: int) -> np.ndarray:
    # No word and no 3-gram ("!", "a"): a vector seeded by the text itself, still deterministic.
    seed = zlib.crc32(text.encode("utf-8"), _salt(model))
    return np.random.default_rng(seed).standard_normal(dims)


def embed_text(model: str, text: str, dims: int) -> np.ndarray:
    """The vector the sandbox returns for TEXT under MODEL at length DIMS: float32, unit norm.

    DIMS is the model's default length, or the request's `dimensions` (a prefix of the
    default-length vector, renormalised)."""
    return embed_batch(model, [text], dims)[0]


def embed_batch(model: str, texts: list[str], dims: int, full_dims: int | None = None) -> np.ndarray:
    """Vectors for TEXTS, shape (len(texts), DIMS). FULL_DIMS is the model's default length
    when DIMS shortens it (defaults to DIMS)."""
    full = full_dims or dims
    salt = _salt(model)
    out = np.empty((len(texts), dims), dtype=np.float32)
    for row, text in enumerate(texts):
        low = text.lower()
        words = np.fromiter((_word_feature(salt, w) for w in _WORD.findall(low)), dtype=np.uint64)
        grams = _ngram_features(low, salt)
        features = np.concatenate((words, grams))
        weights = np.where((features & np.uint64(1)) == 1, 1.0, -1.0)
        weights[words.size:] *= _NGRAM_WEIGHT
        vec = np.bincount((features >> np.uint64(1)) % np.uint64(full), weights=weights,
                          minlength=full)[:dims]
        norm = np.linalg.norm(vec)
        if norm == 0.0:
            vec = _fallback(model, text, full)[:dims]
            norm = np.linalg.norm(vec)
        out[row] = vec / norm
    return out

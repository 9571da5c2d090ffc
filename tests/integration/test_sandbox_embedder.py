"""The sandbox's vectors: deterministic across processes, unit length, lexically meaningful,
the same one by one or in batches. (That the HTTP answer carries exactly these vectors is
checked in test_sandbox_contract.py.)"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from service.sandbox.embedder import embed_batch, embed_text

SMALL = "text-embedding-3-small"
EDGE_TEXTS = ["!", "a", "ab", " ", "\x00", "😀😀", "İstanbul ǅ ß", "x" * 5000, "<|endoftext|>",
              "Ünïcödé wörds and_snake_case 123", "\u0301\u0301", "a\nb\tc"]


def cos(a, b) -> float:
    return float(np.dot(a, b))


def test_vectors_are_deterministic_across_processes():
    code = ("import sys; from service.sandbox.embedder import embed_text; "
            "sys.stdout.write(embed_text('text-embedding-3-small', 'Determinism matters.', 1536).tobytes().hex())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True,
                         env={"PYTHONHASHSEED": "random", "PATH": ""}, cwd=str(__import__("pathlib").Path(
                             __file__).resolve().parents[2]))
    assert bytes.fromhex(out.stdout) == embed_text(SMALL, "Determinism matters.", 1536).tobytes()


@pytest.mark.parametrize("text", EDGE_TEXTS, ids=range(len(EDGE_TEXTS)))
def test_every_text_gets_a_unit_float32_vector(text):
    v = embed_text(SMALL, text, 1536)
    assert v.dtype == np.float32 and v.shape == (1536,) and np.all(np.isfinite(v))
    assert abs(float(np.linalg.norm(v)) - 1.0) < 1e-5


def test_near_duplicates_are_closer_than_unrelated_texts():
    pairs = [("The quarterly report shows revenue growth in Europe.",
              "The quarterly report shows revenue growth in europe!",
              "Bake the bread at two hundred degrees for forty minutes."),
             ("Квартальный отчёт показывает рост выручки в Европе.",
              "Квартальный отчёт показал рост выручки в Европе.",
              "def parse(line): return line.split(',')"),
             ("def parse(line): return line.split(',')",
              "def parse(row): return row.split(',')",
              "The quarterly report shows revenue growth in Europe.")]
    for base, near, far in pairs:
        a, b, c = (embed_text(SMALL, t, 1536) for t in (base, near, far))
        assert cos(a, b) > 0.5 > 0.2 > cos(a, c)
    # ordering by overlap: sharing more words means closer
    q = embed_text(SMALL, "red apples and green pears", 1536)
    more = embed_text(SMALL, "red apples and green grapes", 1536)
    less = embed_text(SMALL, "red cars and blue boats", 1536)
    assert cos(q, more) > cos(q, less)


def test_models_give_different_vectors_for_one_text():
    a = embed_text("text-embedding-3-small", "same text", 1024)
    b = embed_text("vendorD-embed-2312", "same text", 1024)
    assert abs(cos(a, b)) < 0.5


def test_dimensions_is_the_renormalised_prefix():
    full = embed_text(SMALL, "shorten this vector please", 1536)
    short = embed_text(SMALL, "shorten this vector please", 256, 1536)
    np.testing.assert_allclose(short, full[:256] / np.linalg.norm(full[:256]), rtol=1e-5, atol=1e-6)


def test_batches_equal_single_texts_across_group_boundaries():
    texts = [f"text number {i} " + "filler " * (i % 13) for i in range(600)] + EDGE_TEXTS
    batch = embed_batch(SMALL, texts, 1536)
    for i in (0, 255, 256, 257, 511, 599, *range(600, 600 + len(EDGE_TEXTS))):
        np.testing.assert_array_equal(batch[i], embed_text(SMALL, texts[i], 1536))


def test_embedding_speed_is_measured():
    texts = [f"Document {i}: " + "lorem ipsum dolor sit amet consectetur " * 50 for i in range(2000)]
    t0 = time.perf_counter()
    embed_batch(SMALL, texts, 1536)
    per_text_us = (time.perf_counter() - t0) / len(texts) * 1e6
    print(f"\nembedder: {per_text_us:.0f} us per {len(texts[0])}-character text")

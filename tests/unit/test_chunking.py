"""Chunks sized for search: --chunk-tokens and split.chunk_tokens (at most the model's limit,
which stays the default), and a view's chunking told from its manifest, or from the signature
of a view committed before manifests recorded it."""
from __future__ import annotations

import pytest

from pipeline.checks.chunking import describe, view_chunking
from pipeline.exits import UsageError
from pipeline.outdir.view import View
from pipeline.settings import steps
from pipeline.settings.config import parse_settings
from pipeline.settings.job import resolve
from pipeline.settings.options import command_options
from service.catalog import ConfigError
from service.tokenizer import ENCODING_NAME
from transforms.read.changes import Chunking, signature

MODEL = "text-embedding-3-small"


def job(*flags: str):
    return resolve(command_options(["--input", "in.parquet", "--output", "out", "--model", MODEL,
                                    "--base-url", "http://127.0.0.1:1/v1", *flags]), need_output=True)


def test_the_default_is_the_models_limit_and_the_flag_sets_it():
    assert job().chunking == Chunking(8191, 0, 0.1) and job().split.max_tokens == 8191
    small = job("--chunk-tokens", "300", "--overlap-tokens", "30")
    assert small.chunking == Chunking(300, 30, 0.1) and small.split.max_tokens == 300
    assert small.signature != job("--chunk-tokens", "301", "--overlap-tokens", "30").signature
    assert job().chunk_text and not job("--no-chunk-text").chunk_text
    assert job().signature != job("--no-chunk-text").signature == job().other_signature


@pytest.mark.parametrize("flags, words", [
    (("--chunk-tokens", "8192"), "--chunk-tokens must be between 4 and 8191 for text-embedding-3-small"),
    (("--chunk-tokens", "3"), "--chunk-tokens must be between 4 and 8191"),
    (("--chunk-tokens", "-1"), "--chunk-tokens must be between 4 and 8191"),
    (("--chunk-tokens", "100", "--overlap-tokens", "26"), "a quarter of the chunk's 100 tokens (25), got 26"),
])
def test_a_chunk_size_the_model_cannot_take_is_a_usage_error(flags, words):
    with pytest.raises(UsageError, match=words.replace("(", r"\(").replace(")", r"\)")):
        job(*flags)


def test_the_setting_is_a_count_at_least_four_or_null():
    assert parse_settings("split: {chunk_tokens: 512}").split.chunk_tokens == 512
    assert parse_settings("split: {chunk_tokens: null}").split.chunk_tokens is None
    for bad in ("3", "1.5", "true", "'300'", "-8"):
        with pytest.raises(ConfigError, match="chunk_tokens"):
            parse_settings(f"split: {{chunk_tokens: {bad}}}")
    assert parse_settings("output: {chunk_text: false}").output.chunk_text is False
    with pytest.raises(ConfigError, match="chunk_text"):
        parse_settings("output: {chunk_text: 0}")


def test_the_library_refuses_chunks_over_the_models_limit():
    model = steps.catalogue(None)[MODEL]
    with pytest.raises(ValueError, match="at most 8191 for text-embedding-3-small"):
        steps.split_config(parse_settings("split: {chunk_tokens: 9000}"), model)
    assert steps.split_config(parse_settings("split: {chunk_tokens: 256}"), model).max_tokens == 256


def view(signature_of: Chunking | None, recorded: Chunking | None = None, text: bool = False) -> View:
    sig = signature(ENCODING_NAME, signature_of, ("lang",), text).hex() if signature_of else "00" * 32
    return View("v", MODEL, 1536, sig, ("lang",), {}, chunking=recorded)


def test_a_views_chunking_is_its_manifests_or_found_from_its_signature():
    model, hint = steps.catalogue(None)[MODEL], Chunking(300, 0, 0.1)
    assert view(None, recorded=Chunking(300, 20, 0.1)).chunking == Chunking(300, 20, 0.1)
    assert view_chunking(view(None, Chunking(300, 20, 0.1)), model, hint) == Chunking(300, 20, 0.1)
    # committed before manifests said it: the model's limit, the overlap and window that made it
    assert view_chunking(view(Chunking(8191, 0, 0.1)), model, hint) == Chunking(8191, 0, 0.1)
    assert view_chunking(view(Chunking(8191, 17, 0.1)), model, hint) == Chunking(8191, 17, 0.1)
    assert view_chunking(view(Chunking(8191, 5, 0.25)), model, Chunking(8191, 0, 0.25)) == Chunking(8191, 5, 0.25)
    assert view_chunking(view(Chunking(512, 0, 0.1)), model, hint) is None   # no such view was ever made
    assert view_chunking(view(None), model, hint) is None


def test_chunks_are_named_as_their_flags():
    assert describe(Chunking(300, 0, 0.1)) == "300-token chunks (--chunk-tokens 300)"
    assert describe(Chunking(300, 30, 0.2)) == ("300-token chunks overlapping by 30 (--chunk-tokens 300 "
                                                "--overlap-tokens 30, split.boundary_window 0.2)")

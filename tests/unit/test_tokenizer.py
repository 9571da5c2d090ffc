"""The shipped cl100k_base: parsed offline, checked against its SHA-256, token lengths from its ranks."""
from __future__ import annotations

import base64
import hashlib

import pytest

from service.tokenizer import CL100K_SHA256, TokenizerError, _encoding_bytes, get_encoding, parse_ranks, \
    token_byte_lengths


def test_the_shipped_file_parses_to_every_rank_and_round_trips():
    enc = get_encoding()
    text = "naïve café — 数据 🚀 <|endoftext|> def f(x):\n\treturn x"
    assert enc.decode(enc.encode_ordinary(text)) == text
    assert enc.n_vocab == 100277


def test_token_lengths_are_those_tiktoken_decodes():
    enc = get_encoding()
    lengths = token_byte_lengths(enc)
    for token in range(enc.n_vocab):
        try:
            expected = len(enc.decode_single_token_bytes(token))
        except KeyError:   # unused ids between the ranks and the special tokens
            expected = 0
        assert lengths[token] == expected, token


def test_a_file_that_is_not_the_published_one_is_refused():
    data = _encoding_bytes()
    with pytest.raises(TokenizerError, match="SHA-256"):
        parse_ranks(data + b"\n")
    assert parse_ranks(data, CL100K_SHA256)[base64.b64decode("IQ==")] == 0   # "!" is rank 0


def test_a_line_without_its_rank_is_refused():
    data = b"IQ== 0\nIg==\n"
    with pytest.raises(TokenizerError, match="without its rank"):
        parse_ranks(data, hashlib.sha256(data).hexdigest())

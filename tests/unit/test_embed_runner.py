"""The request runner's handling of what the service answers, without Beam.

The client is a real EmbeddingsClient against a real sandbox where the behaviour needs one;
here only the pure parts: re-splitting an over-long input."""
from __future__ import annotations

from service.tokenizer import get_encoding
from transforms.embed_runner import resplit
from transforms.records import ChunkRef, TextItem
from transforms.splitting import SplitConfig, Splitter


def _item(text: str) -> TextItem:
    enc = get_encoding()
    n = len(enc.encode_ordinary(text))
    ref = ChunkRef("doc", 3, 5, 100, 100 + n, n, ())
    return TextItem("sha", text, n, (ref,))


def _splitter(n: int) -> Splitter:
    return Splitter(get_encoding(), SplitConfig(max_tokens=n))


def test_resplit_halves_keep_the_chunk_index_and_tile_the_token_span():
    item = _item("alpha beta gamma delta. " * 40)
    pieces = resplit(item, _splitter)
    assert len(pieces) >= 2
    assert "".join(p.text for p in pieces) == item.text
    refs = [p.refs[0] for p in pieces]
    assert {r.chunk_index for r in refs} == {3}
    assert refs[0].token_start == 100 and refs[-1].token_end == 100 + sum(p.n_tokens for p in pieces)
    assert all(a.token_end == b.token_start for a, b in zip(refs, refs[1:]))
    assert all(p.n_tokens <= item.n_tokens // 2 for p in pieces)


def test_an_input_too_short_to_halve_comes_back_whole():
    item = _item("hi there")
    assert resplit(item, _splitter) == [item]

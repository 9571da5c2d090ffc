"""Splitter guarantees, each checked on every chunk: exact counts within the limit, whole
characters, lossless concatenation, consistent token positions."""
from itertools import pairwise
import hashlib
import pickle
import sys
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from service.tokenizer import get_encoding
from transforms.read.split import _LOOKAHEAD_CHARS, Chunk, SplitConfig, Splitter, _Cut, _piece_boundary

ENC = get_encoding()

# Pieces that stress cl100k: scripts, emoji sequences, combining marks, runs with no space,
# unusual whitespace, contractions, special-token text, code.
FRAGMENTS = ["the", "quick", "brown", " ", "  ", "\n", "\n\n", "\r\n", "\t", ". ", "! ", "? ",
             "Привет", "мир", "ёжик", "你好", "世界", "。", "！", "的一是不了", "😀", "👨‍👩‍👧",
             "👍🏽", "e\u0301", "\u00a0", "\u3000", "\u2028", "'s", "'LL", "12345", "3.14",
             "<|endoftext|>", "<|fim_prefix|>", "def f(x):\n    return x\n", "SELECT * FROM t;",
             "{\"a\": [1, 2]}", "é", "ß", "🙂"]
texts = st.lists(st.one_of(
    st.sampled_from(FRAGMENTS),
    st.text(max_size=12),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", " ", "我", "\n", "😀", "-", "Ж"]),
              st.integers(1, 400)),
), max_size=150).map("".join)


@st.composite
def configs(draw):
    max_tokens = draw(st.integers(4, 96))
    return SplitConfig(max_tokens=max_tokens,
                       overlap_tokens=draw(st.integers(0, max_tokens // 4)),
                       boundary_window=draw(st.sampled_from([0.0, 0.15, 0.5])),
                       segment_chars=1024, batch_chars=draw(st.sampled_from([1, 4096, 1 << 20])))


def check(chunks: list[Chunk], doc_id: str, text: str, config: SplitConfig) -> None:
    assert chunks, "a non-blank text yields chunks"
    for i, c in enumerate(chunks):
        assert (c.doc_id, c.chunk_index, c.chunk_count) == (doc_id, i, len(chunks))
        assert c.text
        data = c.text.encode("utf-8")   # strict: no surrogate, i.e. whole characters
        assert c.n_tokens == len(ENC.encode_ordinary(c.text)) <= config.max_tokens
        assert c.token_end - c.token_start == c.n_tokens
        assert c.text_sha256 == hashlib.sha256(data).hexdigest()
    assert chunks[0].token_start == 0
    pairs = list(pairwise(chunks))
    if config.overlap_tokens == 0:
        assert "".join(c.text for c in chunks) == text
        assert all(a.token_end == b.token_start for a, b in pairs)
    else:
        # chunk i+1 starts inside chunk i (sharing at most overlap_tokens) and reaches past it
        assert all(a.token_start <= b.token_start <= a.token_end <= b.token_end and
                   a.token_end - b.token_start <= config.overlap_tokens for a, b in pairs)
        # and the chunks lay over the text end to end: the ends of text a placement can reach
        assert text.startswith(chunks[0].text)
        reach = {len(chunks[0].text)}
        for c in chunks[1:]:
            n = len(c.text)
            reach = {end - k + n for end in reach for k in range(min(n - 1, end) + 1)
                     if text.startswith(c.text, end - k)}
        assert len(text) in reach


@settings(max_examples=300, deadline=None)
@given(text=texts, config=configs())
def test_every_guarantee_holds(text, config):
    chunks = Splitter(ENC, config).split("doc", text)
    if not text or text.isspace():
        assert chunks == []
    else:
        check(chunks, "doc", text, config)


def test_a_run_of_newlines_split_again_is_kept():
    """Found by the property above: the last chunk ran over the limit, was split again, and its
    all-newline piece was taken for a blank document and dropped."""
    text = "quickquick 你好😀aa" + "a" * 998 + "0\x8100:0:0" + "\n" * 98
    config = SplitConfig(max_tokens=4, overlap_tokens=0, boundary_window=0.0, segment_chars=1024, batch_chars=1)
    check(Splitter(ENC, config).split("doc", text), "doc", text, config)


BOUNDARY_FRAGMENTS = FRAGMENTS + ["\u0085", "\r", "\n \n", " \n", "\u2029", "'", ".\n", "   \n  x",
                                  "\n   ", "!\n\n", "  ", "\t\n", "a\u3000\n", "x\u00a0 y"]
boundary_texts = st.lists(st.one_of(st.sampled_from(BOUNDARY_FRAGMENTS), st.text(max_size=6)),
                          max_size=60).map("".join)


@settings(max_examples=400, deadline=None)
@given(text=boundary_texts)
def test_a_piece_boundary_splits_the_encoding_exactly(text):
    # what lets a chunk take its count from the document's tokens instead of a second encoding
    whole = ENC.encode_ordinary(text)
    for i in range(1, len(text)):
        if _piece_boundary(text[max(0, i - 4):i], text[i:i + _LOOKAHEAD_CHARS]):
            assert ENC.encode_ordinary(text[:i]) + ENC.encode_ordinary(text[i:]) == whole, i


def test_piece_boundaries_are_found_in_prose_and_code():
    assert _piece_boundary("word", " next") and _piece_boundary("end.", " Next")
    assert _piece_boundary("line\n", "Next") and _piece_boundary("f():\n", "    return x")
    assert not _piece_boundary("end.", "\nNext")        # ".\n" is one piece
    assert not _piece_boundary("a\n", " \nb")           # the newline run goes on
    assert not _piece_boundary("a ", " b") and not _piece_boundary("a", "b")


@settings(max_examples=40, deadline=None)
@given(docs=st.lists(texts, max_size=8), config=configs())
def test_split_many_equals_split_one_by_one(docs, config):
    splitter = Splitter(ENC, config)
    pairs = [(f"d{i}", t) for i, t in enumerate(docs)]
    assert splitter.split_many(pairs) == [splitter.split(i, t) for i, t in pairs]


def natural_text(paragraphs: int) -> str:
    en = "The pipeline reads a corpus, splits it and embeds each chunk. Costs are tracked! "
    ru = "Каждый фрагмент отправляется один раз, а стоимость распределяется по строкам. "
    zh = "每个片段只发送一次。费用按行分摊！"
    code = "def total(rows):\n    return sum(r.cost for r in rows)\n"
    parts = [(en * (1 + i % 5)) + (ru * (i % 3)) + (zh * (i % 2)) + (code if i % 4 == 0 else "")
             for i in range(paragraphs)]
    return "\n\n".join(parts)


@pytest.mark.parametrize("overlap", [0, 40])
def test_natural_text_over_many_segments(overlap):
    text = natural_text(400)
    config = SplitConfig(max_tokens=300, overlap_tokens=overlap, segment_chars=2048)
    chunks = Splitter(ENC, config).split("d", text)
    check(chunks, "d", text, config)
    if overlap == 0:   # natural cuts only: the positions are the document's own
        assert chunks[-1].token_end == len(ENC.encode_ordinary(text))
    else:              # and the shared part is about what was asked
        shared = [a.token_end - b.token_start for a, b in pairwise(chunks)]
        assert min(shared) >= overlap * 3 // 4
    # cut at natural boundaries: paragraph, line or sentence ends, word starts
    assert all(c.text.endswith(("\n", ".", "!", "。", "！")) or c.text[-1].isalnum()
               and chunks[i + 1].text[0].isspace() for i, c in enumerate(chunks[:-1]))


def test_prefers_a_paragraph_break_then_a_sentence_end():
    sentence = "This sentence is one of many. "
    first = sentence * 10 + "\n\n"
    text = first + sentence * 40
    chunks = Splitter(ENC, SplitConfig(max_tokens=100, boundary_window=0.5)).split("d", text)
    assert chunks[0].text == first
    assert chunks[1].text.endswith(".")
    assert chunks[2].text.startswith(" This")


@pytest.mark.parametrize("text", ["", " ", "\n\t  \r\n", "\u3000\u00a0"])
def test_blank_text_gives_no_chunk(text):
    assert Splitter(ENC, SplitConfig(max_tokens=16)).split("d", text) == []


def test_special_token_text_is_plain_text():
    text = "<|endoftext|>" * 50
    chunks = Splitter(ENC, SplitConfig(max_tokens=32)).split("d", text)
    check(chunks, "d", text, SplitConfig(max_tokens=32))
    assert sum(c.n_tokens for c in chunks) == len(ENC.encode_ordinary(text)) > 50


def test_single_chunk_document():
    (chunk,) = Splitter(ENC, SplitConfig(max_tokens=8191)).split("id-1", "Hello, world.")
    assert (chunk.chunk_index, chunk.chunk_count, chunk.token_start) == (0, 1, 0)
    assert chunk.token_end == chunk.n_tokens == len(ENC.encode_ordinary("Hello, world."))


def test_lone_surrogate_is_replaced_as_tiktoken_does():
    (chunk,) = Splitter(ENC, SplitConfig(max_tokens=64)).split("d", "ab\ud800cd")
    assert chunk.text == "ab\ufffdcd"
    assert chunk.n_tokens == len(ENC.encode_ordinary("ab\ud800cd"))


@pytest.mark.parametrize("text", ["a" * 50_000, "我" * 30_000, "😀" * 5_000,
                                  "".join(chr(0x4E00 + (i * 7919) % 20000) for i in range(20_000))])
def test_long_runs_without_any_natural_boundary(text):
    config = SplitConfig(max_tokens=500, segment_chars=4096)
    check(Splitter(ENC, config).split("d", text), "d", text, config)


def test_over_limit_chunk_is_split_again():
    # No known input makes a chunk count more than its slice; feed one to the safety net.
    splitter = Splitter(ENC, SplitConfig(max_tokens=8))
    text = "Some words that count far more than eight tokens in total, surely."
    fitted = splitter._fit([_Cut(text.encode(), 0, 0, len(ENC.encode_ordinary(text)))])
    assert len(fitted) > 1 and b"".join(c.data for c in fitted).decode() == text
    assert all(c.n_tokens == len(ENC.encode_ordinary(c.data.decode())) <= 8 for c in fitted)


@pytest.mark.parametrize("kwargs", [dict(max_tokens=3), dict(max_tokens=100, overlap_tokens=26),
                                    dict(max_tokens=100, boundary_window=0.6),
                                    dict(max_tokens=100, segment_chars=10)])
def test_config_is_validated(kwargs):
    with pytest.raises(ValueError):
        SplitConfig(**kwargs)


def test_memory_does_not_grow_with_the_document():
    text = natural_text(400)
    text = (text * (2_000_000 // len(text) + 1))[:2_000_000]
    splitter = Splitter(ENC, SplitConfig(max_tokens=8191, segment_chars=1 << 16, batch_chars=1 << 18))
    splitter.split("warm", "up")
    tracemalloc.start()
    try:
        chunks = splitter.split("d", text)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    output = sum(sys.getsizeof(c) + sys.getsizeof(c.text) + sys.getsizeof(c.text_sha256) for c in chunks)
    # the document's ~500k tokens as one list of Python ints alone would take ~18 MB
    assert peak - output < 4_000_000


def test_chunks_and_config_survive_pickling():   # Beam ships both between workers
    config = SplitConfig(max_tokens=64, overlap_tokens=8)
    chunks = Splitter(ENC, config).split("d", natural_text(3))
    assert pickle.loads(pickle.dumps((config, chunks))) == (config, chunks)


WORDS = ["word", "passage", "search", "вектор", "поиск", "данные", "向量", "段落", "😀", "👨‍👩‍👧", "é", "x1",
         "Pneumonoultramicroscopicsilicovolcanoconiosis"]
SEPARATORS = [" ", " ", " ", "  ", ", ", ". ", "! ", "? ", "\n", "\n\n", "。", "！", "\t"]
worded = st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)), min_size=1, max_size=120).map(
    lambda pairs: "".join(w + s for w, s in pairs))
spaceless = st.lists(st.sampled_from(["向量", "段落", "保存", "😀", "ж", "Pneumono", "🌦️"]), min_size=1,
                     max_size=200).map("".join)


def _boundary(text: str, at: int) -> bool:
    """A place a reader cuts at: a paragraph, line or sentence end, or the start of a space
    (the splitter's `_boundary_class` > 0, on characters)."""
    before, after = text[at - 1], text[at] if at < len(text) else ""
    return before == "\n" or before in "。！？" or (after in " \t\n\r\x0b\x0c" and before not in " \t\n\r\x0b\x0c")


def _window_boundaries(text: str, start: int, config: SplitConfig) -> bool:
    """Whether the last boundary_window of the window of max_tokens tokens from START holds a
    boundary at a token boundary (the splitter's candidates for the cut)."""
    tokens = ENC.encode_ordinary(text[start:])
    if len(tokens) <= config.max_tokens:
        return False
    ends = [len(ENC.decode_bytes(tokens[:k])) for k in range(1, config.max_tokens + 1)]
    data = text[start:].encode("utf-8")
    lo = config.max_tokens - int(config.boundary_window * config.max_tokens)
    for end in ends[max(lo, 1) - 1:]:
        if end < len(data) and data[end] & 0xC0 != 0x80 and _boundary(text, start + len(data[:end].decode("utf-8"))):
            return True
    return False


@settings(max_examples=150, deadline=None)
@given(text=st.one_of(worded, spaceless), max_tokens=st.integers(8, 64),
       window=st.sampled_from([0.1, 0.25, 0.5]))
def test_no_cut_inside_a_word_where_the_window_holds_a_boundary(text, max_tokens, window):
    """Each chunk ends at the window's last paragraph break, else line or sentence end, else
    word start, when its last part holds one; else between tokens (never inside a character:
    CJK without spaces, emoji, one long word)."""
    config = SplitConfig(max_tokens=max_tokens, boundary_window=window)
    chunks = Splitter(ENC, config).split("d", text)
    check(chunks, "d", text, config)
    start = 0
    for chunk in chunks[:-1]:
        end = start + len(chunk.text)
        if _window_boundaries(text, start, config):
            assert _boundary(text, end), (chunk.text[-12:], text[end:end + 12])
        start = end

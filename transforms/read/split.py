"""Token-exact splitting of documents into chunks that fit a model's input limit.

Guarantees (tests/unit/test_splitting*.py prove each one):
- every chunk's n_tokens is len(encoding.encode_ordinary(chunk.text)), counted on the chunk
  itself (what the service counts), and n_tokens <= max_tokens;
- chunk texts are whole characters (a cut never falls inside a multi-byte UTF-8 sequence);
- without overlap the chunks of a document concatenate to exactly its text;
- token_end - token_start == n_tokens; without overlap token_end of chunk i is token_start of
  chunk i+1 and the first starts at 0. With overlap, token_start of chunk i+1 is token_end of
  chunk i minus the tokens the two share. These are the document's own token positions
  (token_end of the last chunk == len(encode_ordinary(text))) when every cut is a natural one;
  a cut forced inside a run of symbols or spaces may leave one side a token shorter than its
  slice of the document, and the positions then add up the chunks' own counts.

How: the document is encoded in segments (cut after a newline or before a space, so they
tokenize as in the whole text) and only a window of tokens is kept, as a numpy array with
byte offsets, so a text of tens of megabytes never becomes one Python int per token. Cuts are
chosen at token boundaries that start a whole character, preferring a paragraph break, then a
line or sentence end, then the start of whitespace, within the last boundary_window of the
window. A chunk whose both ends are boundaries of cl100k's regex pieces (`_piece_boundary`)
tokenizes exactly as its slice of the document, so its n_tokens is the slice's token count;
any other chunk (a cut inside a piece, a segment joined inside one) is re-encoded on its own
for its count, and a chunk over the limit is split again. So each token is encoded once on
natural text, and a document that fits in one chunk is counted by its first encoding.
"""
from __future__ import annotations

import dataclasses
import hashlib
import unicodedata
from collections.abc import Iterator, Sequence

import numpy as np
import tiktoken

from service.tokenizer import token_byte_lengths

# A code point is at most 4 UTF-8 bytes, and cl100k has a token for every byte, so a chunk of
# one character never needs more than this: below it, exact splitting could be impossible.
MIN_MAX_TOKENS = 4


@dataclasses.dataclass(frozen=True, slots=True)
class Chunk:
    doc_id: str
    chunk_index: int
    chunk_count: int
    token_start: int
    token_end: int
    n_tokens: int
    text: str
    text_sha256: str


@dataclasses.dataclass(frozen=True)
class SplitConfig:
    """max_tokens: the largest chunk (ModelSpec.chunk_tokens). overlap_tokens: tokens repeated
    at the start of the next chunk (at most max_tokens // 4). boundary_window: the fraction of
    max_tokens, searched back from the end of a full window, where a natural cut is preferred
    to a token boundary. segment_chars: characters encoded at once (memory of huge texts).
    batch_chars: characters per encode_ordinary_batch call (threads vs. transient memory)."""
    max_tokens: int
    overlap_tokens: int = 0
    boundary_window: float = 0.1       # configs/pipeline.yaml split.boundary_window: the job's chunks
    segment_chars: int = 1 << 18
    batch_chars: int = 1 << 20

    def __post_init__(self) -> None:
        if self.max_tokens < MIN_MAX_TOKENS:
            raise ValueError(f"max_tokens must be >= {MIN_MAX_TOKENS}, got {self.max_tokens}")
        if not 0 <= self.overlap_tokens <= self.max_tokens // 4:
            raise ValueError(f"overlap_tokens must be between 0 and a quarter of the chunk's {self.max_tokens} "
                             f"tokens ({self.max_tokens // 4}), got {self.overlap_tokens}")
        if not 0 <= self.boundary_window <= 0.5:
            raise ValueError(f"boundary_window must be in [0, 0.5], got {self.boundary_window}")
        if self.segment_chars < 1024 or self.batch_chars < 1:
            raise ValueError("segment_chars must be >= 1024 and batch_chars >= 1")


def _blank(text: str) -> bool:
    return not text or text.isspace()   # isspace: no copy of a huge text, unlike strip()


def _utf8(segment: str) -> bytes:
    """Lone surrogates (impossible in Arrow strings) become U+FFFD, as tiktoken does."""
    try:
        return segment.encode("utf-8")
    except UnicodeEncodeError:
        return segment.encode("utf-16", "surrogatepass").decode("utf-16", "replace").encode("utf-8")


def _encode(encoding: tiktoken.Encoding, data: Sequence[bytes]) -> list[np.ndarray]:
    """Tokens of UTF-8 texts (uint32 arrays: encode_ordinary's result without a Python int per
    token, ~7% less CPU). tiktoken caches a UTF-8 copy inside every str it encodes, so it gets
    throwaway strings: neither the caller's texts nor the chunks keep that copy. One thread:
    Beam parallelises across workers already, and tiktoken's batch pool of 8 threads cost
    1.6-2x the CPU of one on a 2-core worker (docs/BENCH.md)."""
    return [encoding.encode_to_numpy(d.decode("utf-8"), disallowed_special=()) for d in data]


_HSPACE = " \t\x0b\x0c"
_LOOKAHEAD_CHARS = 64


def _solid(ch: str) -> bool:
    """Certainly not matched by the regex's \\s (Unicode White_Space is within Z* and Cc)."""
    return not ch.isspace() and unicodedata.category(ch) not in ("Zs", "Zl", "Zp", "Cc")


def _piece_boundary(left: str, right: str) -> bool:
    """Whether cl100k's regex ends a piece between LEFT's last and RIGHT's first character
    whatever comes before LEFT or after RIGHT (RIGHT: at least the next few characters).
    Then text[:cut] and text[cut:] tokenize as their slices of text: the regex scans left to
    right, a scan from a piece start sees the same pieces, and the only pattern that looks
    ahead, \\s+(?!\\S), cannot end at a piece end before a non-space differently. Conservative:
    - a solid character, then a horizontal space (no piece runs from a non-space into a space);
    - a newline, then a solid character (newline runs end before any non-newline);
    - a newline, then horizontal spaces up to a solid character (the run's last newline)."""
    if not left or not right:
        return False
    a, b = left[-1], right[0]
    if b in _HSPACE:
        if _solid(a):
            return True
        rest = right.lstrip(_HSPACE)
        return a == "\n" and bool(rest) and _solid(rest[0])
    return a == "\n" and _solid(b)


def _segments(text: str, size: int) -> Iterator[tuple[bytes, bool]]:
    """(piece, joins naturally): pieces of about `size` characters, cut after a newline
    followed by a non-space, else before a space between two non-spaces, else anywhere. A
    natural join (`_piece_boundary`) tokenizes as the whole text; the others are re-counted."""
    pos, end = 0, len(text)
    while pos < end:
        cut = end if end - pos <= size else _segment_cut(text, pos + size // 2, pos + size)
        yield _utf8(text[pos:cut]), pos == 0 or _piece_boundary(text[max(0, pos - 4):pos],
                                                                 text[pos:pos + _LOOKAHEAD_CHARS])
        pos = cut


def _segment_cut(text: str, lo: int, hi: int) -> int:
    i = text.rfind("\n", lo, hi)
    while i != -1:
        if not text[i + 1].isspace():
            return i + 1
        i = text.rfind("\n", lo, i)
    i = text.rfind(" ", lo, hi)
    while i != -1:
        if not text[i - 1].isspace() and not text[i + 1].isspace():
            return i
        i = text.rfind(" ", lo, i)
    return hi


class _Stream:
    """A window of one document's tokens with their byte offsets, in document coordinates.
    Segments are encoded on demand; tokens before the current chunk are dropped."""

    def __init__(self, encoding: tiktoken.Encoding, lengths: np.ndarray,
                 segments: Iterator[tuple[bytes, bool]], first: tuple[bytes, np.ndarray] | None = None):
        self._encoding, self._lengths, self._segments = encoding, lengths, segments
        self.tok0 = 0                                  # document index of buffered token 0
        self.offs = np.zeros(1, dtype=np.int64)        # byte offset of each token start, + end
        self._buf = b""
        self._view = np.frombuffer(self._buf, dtype=np.uint8)
        self.exhausted = False
        self.segments = 0
        self.forced_joins: list[int] = []   # byte offsets where segments joined inside a piece
        if first is not None:
            self._append(*first)

    @property
    def end_tok(self) -> int:
        return self.tok0 + len(self.offs) - 1

    @property
    def end_byte(self) -> int:
        return int(self.offs[-1])

    def ensure(self, token: int) -> None:
        """Encode segments until the buffer holds token index `token` or the text ends."""
        while self.end_tok <= token and not self.exhausted:
            segment = next(self._segments, None)
            if segment is None:
                self.exhausted = True
            else:
                data, natural = segment
                if not natural:
                    self.forced_joins.append(self.end_byte)
                self._append(data, _encode(self._encoding, [data])[0])

    def _append(self, data: bytes, tokens: np.ndarray) -> None:
        self.segments += 1
        ends = self.offs[-1] + np.cumsum(self._lengths[tokens])
        self.offs = np.concatenate([self.offs, ends])
        self._buf += data
        self._view = np.frombuffer(self._buf, dtype=np.uint8)

    def trim(self, token: int) -> None:
        drop = token - self.tok0
        if drop > 0:
            self._buf = self._buf[int(self.offs[drop] - self.offs[0]):]
            self._view = np.frombuffer(self._buf, dtype=np.uint8)
            self.offs = self.offs[drop:]
            self.tok0 = token

    def off(self, token: int) -> int:
        return int(self.offs[token - self.tok0])

    def bytes_at(self, positions: np.ndarray, shift: int) -> np.ndarray:
        """The byte at each document offset + shift (clipped to the buffer)."""
        index: np.ndarray = np.clip(positions + shift - self.offs[0], 0, len(self._view) - 1)
        return self._view.take(index)

    def is_char_start(self, pos: int) -> bool:
        return pos >= self.end_byte or (self._view[pos - self.offs[0]] & 0xC0) != 0x80

    def token_of(self, pos: int) -> int:
        """Index of the token holding document byte `pos`."""
        return self.tok0 + int(np.searchsorted(self.offs, pos, side="right")) - 1

    def data(self, start: int, end: int) -> bytes:
        base = int(self.offs[0])
        return self._buf[start - base:end - base]

    def is_piece_boundary(self, pos: int, token: int) -> bool:
        """Whether document byte POS starts TOKEN and ends a regex piece (`_piece_boundary`);
        the document's own start and end are."""
        if self.off(token) != pos:
            return False
        if pos == 0 or (pos == self.end_byte and self.exhausted):
            return True
        i = pos - int(self.offs[0])
        before, after = self._buf[max(0, i - 4):i], self._buf[i:i + 4 * _LOOKAHEAD_CHARS]
        if (i < 4 and before and before[0] & 0xC0 == 0x80) or (after and after[0] & 0xC0 == 0x80):
            return False   # a character cut by the buffer's start, or POS inside one
        return _piece_boundary(before.decode("utf-8", "ignore"), after.decode("utf-8", "ignore"))


_WHITESPACE = np.frombuffer(b" \t\n\r\x0b\x0c", dtype=np.uint8)
_SENTENCE_END = np.frombuffer(b".!?", dtype=np.uint8)
_CJK_STOPS = [b"\xe3\x80\x82", b"\xef\xbc\x81", b"\xef\xbc\x9f"]   # 。！？


def _boundary_class(stream: _Stream, pos: np.ndarray) -> np.ndarray:
    """3 paragraph break, 2 line or sentence end, 1 start of whitespace, 0 other, for cuts
    before `pos`. All are boundaries of cl100k's regex pieces on both sides of the cut, so the
    chunks tokenize as their slices of the document."""
    prev1, prev2, prev3 = (stream.bytes_at(pos, -k) for k in (1, 2, 3))
    nxt = stream.bytes_at(pos, 0)
    newline = prev1 == 0x0A
    paragraph = newline & ((prev2 == 0x0A) | ((prev2 == 0x0D) & (prev3 == 0x0A)))
    next_space = np.isin(nxt, _WHITESPACE)
    sentence = newline | (np.isin(prev1, _SENTENCE_END) & next_space)
    for stop in _CJK_STOPS:
        sentence |= (prev3 == stop[0]) & (prev2 == stop[1]) & (prev1 == stop[2])
    space = next_space & ~np.isin(prev1, _WHITESPACE)   # the start of a run: "a|  1" not "a  |1"
    return np.where(paragraph, 3, np.where(sentence, 2, np.where(space, 1, 0)))


@dataclasses.dataclass(slots=True)
class _Cut:
    data: bytes                   # the chunk's UTF-8
    overlap: int                  # tokens of the slice shared with the previous chunk
    shared: int                   # bytes of data shared with the previous chunk
    n_tokens: int | None = None   # exact, once counted


class Splitter:
    def __init__(self, encoding: tiktoken.Encoding, config: SplitConfig):
        self._encoding = encoding
        self._config = config
        self._lengths = token_byte_lengths(encoding)

    def split(self, doc_id: str, text: str) -> list[Chunk]:
        return self.split_many([(doc_id, text)])[0]

    def split_many(self, docs: Sequence[tuple[str, str]]) -> list[list[Chunk]]:
        """Chunks of each document, in order. Encoding and the exactness check run in batches
        on tiktoken's threads; a blank text yields [] (the caller dead-letters it)."""
        out: list[list[Chunk]] = []
        for group in self._groups(docs):
            plans = self._plan_group(["" if _blank(text) else text for _, text in group])
            self._count([cut for plan in plans for cut in plan])
            out.extend(self._chunks(doc_id, self._fit(plan))
                       for (doc_id, _), plan in zip(group, plans, strict=True))
        return out

    def _plan_group(self, texts: list[str]) -> list[list[_Cut]]:
        """Plans for a group, its first segments encoded in one batch; none for an empty text. A
        blank one is planned: a piece of a document that _fit splits again may be all spaces."""
        segments = [_segments(text, self._config.segment_chars) for text in texts]
        firsts = [next(it)[0] if text else None for text, it in zip(texts, segments, strict=True)]
        tokens = iter(_encode(self._encoding, [f for f in firsts if f is not None]))
        plans: list[list[_Cut]] = []
        for text, it, first in zip(texts, segments, firsts, strict=True):
            if first is None:
                plans.append([])
                continue
            ids = next(tokens)
            if len(text) <= self._config.segment_chars and len(ids) <= self._config.max_tokens:
                plans.append([_Cut(first, 0, 0, len(ids))])   # the usual short document
            else:
                plans.append(self._plan(_Stream(self._encoding, self._lengths, it, (first, ids))))
        return plans

    def _fit(self, plan: list[_Cut]) -> list[_Cut]:
        """Split again, on its own tokens and without its overlap, a chunk over the limit: one
        whose window held no whole-character token boundary past the previous chunk (a cut
        forced after the next character, with tiny limits), or one counting more than its slice
        of the document (cuts at whole-character token boundaries never did in fuzzing; they
        can count one token less). Ends: each pass yields shorter texts, down to one character."""
        fitted: list[_Cut] = []
        for cut in plan:
            assert cut.n_tokens is not None   # the caller counted the plan
            if cut.n_tokens <= self._config.max_tokens:
                fitted.append(cut)
                continue
            sub = self._plan_group([cut.data[cut.shared:].decode("utf-8")])[0]   # overlap dropped
            self._count(sub)
            fitted.extend(self._fit(sub))
        return fitted

    def _groups(self, docs: Sequence[tuple[str, str]]) -> Iterator[list[tuple[str, str]]]:
        group: list[tuple[str, str]] = []
        size = 0
        for doc in docs:
            group.append(doc)
            size += min(len(doc[1]), self._config.segment_chars)
            if size >= self._config.batch_chars:
                yield group
                group, size = [], 0
        if group:
            yield group

    def _count(self, cuts: list[_Cut]) -> None:
        """Exact token count of every cut not counted yet, in batches of about batch_chars."""
        todo = [cut for cut in cuts if cut.n_tokens is None]
        start, size = 0, 0
        for i, cut in enumerate(todo):
            size += len(cut.data)
            if size >= self._config.batch_chars or i == len(todo) - 1:
                batch = todo[start:i + 1]
                for c, n in zip(batch, map(len, _encode(self._encoding, [c.data for c in batch])), strict=True):
                    c.n_tokens = n
                start, size = i + 1, 0

    def _plan(self, stream: _Stream) -> list[_Cut]:
        """Cut the document into chunks of at most max_tokens tokens of its token stream."""
        cuts: list[_Cut] = []
        start_tok = start = 0     # the token holding the chunk's first byte; that byte's offset
        floor = overlap = 0       # floor: the previous chunk's end, the next one must pass it
        start_exact = True        # the chunk starts at a piece boundary
        while True:
            end, end_tok = self._choose_end(stream, start_tok, floor,
                                            start_tok + self._config.max_tokens)
            if end == stream.end_byte:
                stream.ensure(stream.end_tok)   # a forced cut may reach the end of the buffer
            last = end == stream.end_byte and stream.exhausted
            exact = (start_exact and stream.is_piece_boundary(end, end_tok)
                     and not any(start < j < end for j in stream.forced_joins))
            cuts.append(_Cut(stream.data(start, end), overlap, floor - start,
                             end_tok - start_tok if exact else None))
            if last:
                return cuts
            floor = end
            start_tok, start, overlap = self._next_start(stream, start_tok, start, end, end_tok)
            start_exact = stream.is_piece_boundary(start, start_tok)
            stream.trim(start_tok)

    def _choose_end(self, stream: _Stream, start_tok: int, floor: int,
                    target: int) -> tuple[int, int]:
        """The chunk's end byte and the token holding it (its end token when at a boundary)."""
        stream.ensure(target)
        if target >= stream.end_tok and stream.exhausted:
            return stream.end_byte, stream.end_tok
        first = max(start_tok, stream.token_of(floor)) + 1
        lo = max(first, target - int(self._config.boundary_window * self._config.max_tokens))
        for tokens, natural in ((np.arange(lo, target + 1), True), (np.arange(first, lo), False)):
            pos = stream.offs[tokens - stream.tok0]
            ok = ((stream.bytes_at(pos, 0) & 0xC0) != 0x80) & (pos > floor)
            if ok.any():
                classes = np.where(ok, _boundary_class(stream, pos) if natural else 0, -1)
                best = int(np.flatnonzero(classes == classes.max())[-1])
                return int(pos[best]), int(tokens[best])
        # No whole-character token boundary in reach: cut between characters inside a token.
        end = stream.off(target)
        while end > floor and not stream.is_char_start(end):
            end -= 1
        if end <= floor:
            end = floor + 1
            while not stream.is_char_start(end):
                end += 1
        return end, stream.token_of(end)

    def _next_start(self, stream: _Stream, start_tok: int, start: int, end: int,
                    end_tok: int) -> tuple[int, int, int]:
        """Where the next chunk starts: at the end, or overlap_tokens back from it, preferring
        a word start; returns (token, byte, shared tokens)."""
        want = self._config.overlap_tokens
        if want == 0:
            return end_tok, end, 0
        tokens = np.arange(max(end_tok - want, start_tok + 1), end_tok)
        pos = stream.offs[tokens - stream.tok0]
        ok = ((stream.bytes_at(pos, 0) & 0xC0) != 0x80) & (pos > start) & (pos < end)
        if not ok.any():
            return end_tok, end, 0
        near = tokens < tokens[0] + max(1, want // 4)
        words = ok & near & (_boundary_class(stream, pos) > 0)
        best = int(np.flatnonzero(words if words.any() else ok)[0])
        return int(tokens[best]), int(pos[best]), end_tok - int(tokens[best])

    def _chunks(self, doc_id: str, plan: list[_Cut]) -> list[Chunk]:
        chunks = []
        start = end = 0
        for index, cut in enumerate(plan):
            assert cut.n_tokens is not None   # _fit's cuts are counted
            start = max(start, end - min(cut.overlap, cut.n_tokens))
            end = start + cut.n_tokens
            chunks.append(Chunk(doc_id, index, len(plan), start, end, cut.n_tokens,
                                cut.data.decode("utf-8"), hashlib.sha256(cut.data).hexdigest()))
            cut.data = b""   # release the bytes once the text exists: lowers a huge text's peak
        return chunks

"""A passage shortened around a query's words, for a terminal: `search` prints each hit so.

A word of the passage matches a word of the query when they are equal ignoring case, when one
begins with the other and the shorter has at least PREFIX characters (`search`, `searching`:
close to what a stemming text search configuration matches), or, in scripts written without
spaces (Chinese, Japanese, Korean), when it contains the query's word. The window holds the most
distinct query words it can, a word the passage holds often counting less (`the`), with a little
of what precedes the first; it is cut at spaces, and an ellipsis marks each cut end. Control
characters and bidi overrides are shown escaped (`visible`): a passage is the corpus's text, and
a terminal would obey them.
"""
from __future__ import annotations

import re

PREFIX = 4
ELLIPSIS = "…"
_WORD = re.compile(r"\w+")
_LEAD = 0.2   # share of the window before its first match
# C0, DEL and C1 controls (a terminal's escapes), and the bidi embeddings, overrides and isolates
# (which reorder what follows them on the screen)
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """TEXT with each control character and bidi override shown as its escape (\\x1b, \\u202e)."""
    return _UNSAFE.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


def _unspaced(word: str) -> bool:
    return any("\u3040" <= ch <= "\u9fff" or "\uac00" <= ch <= "\ud7af" or "\uf900" <= ch <= "\ufaff"
               for ch in word)


def _matches(token: str, words: list[str]) -> int | None:
    """Which of WORDS (casefolded) TOKEN matches, by index, or None."""
    t = token.casefold()
    for i, w in enumerate(words):
        short, long_ = (t, w) if len(t) <= len(w) else (w, t)
        if t == w or (len(short) >= PREFIX and long_.startswith(short)) or (_unspaced(t) and w in t):
            return i
    return None


def snippet(passage: str, query: str | None, width: int) -> str:
    """PASSAGE (whitespace folded, controls escaped) in at most WIDTH characters around QUERY's words."""
    flat = visible(" ".join(passage.split()))
    if len(flat) <= width:
        return flat
    words = [w.casefold() for w in _WORD.findall(query or "")]
    hits = [(m.start(), i) for m in _WORD.finditer(flat) if (i := _matches(m.group(), words)) is not None]
    seen = [sum(i == j for _, j in hits) for i in range(len(words))]
    best, start = -1.0, 0
    for pos, _ in hits:
        at = max(0, pos - int(width * _LEAD))
        found = sum(1 / seen[i] for i in {i for p, i in hits if at <= p < at + width - 2})
        if found > best:
            best, start = found, at
    if start:
        space = flat.find(" ", start, start + width // 4)
        start = space + 1 if space != -1 else start
    end = min(len(flat), start + width - (1 if start else 0) - 1)
    if end < len(flat):
        space = flat.rfind(" ", start, end)
        end = space if space > start + width // 2 else end
    return (ELLIPSIS if start else "") + flat[start:end] + (ELLIPSIS if end < len(flat) else "")

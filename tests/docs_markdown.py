"""The project's Markdown as the docs tests read it: which files, their links, their headings'
anchors (GitHub's rules), and the command blocks they mark as runnable.

A runnable block is a fenced `bash` block right after a line `<!-- runnable -->`. It runs as
written in a directory holding `corpus/*.parquet` (columns id, text), with `python` the
project's interpreter, `EMBEDDINGS_API_KEY` set and `BASE_URL` a sandbox's
(tests/e2e/test_docs_runnable.py). Mark only blocks that are safe and take seconds.
"""
from __future__ import annotations

import os
import re
import unicodedata
from pathlib import Path

from tests.side_venv import REPO

RUNNABLE = "<!-- runnable -->"
FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def user_docs() -> list[Path]:
    """What a user and a maintainer read: the README, ARCHITECTURE.md and docs/."""
    return [REPO / "README.md", REPO / "ARCHITECTURE.md", *sorted((REPO / "docs").glob("*.md"))]


def all_markdown() -> list[Path]:
    """Every Markdown file of the project (for links): hidden directories (virtualenvs, .git),
    build output and `make run`'s demo/ are not walked."""
    found = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if not d.startswith(".") and not d.endswith(".egg-info")
                   and d not in {"build", "demo", "node_modules", "__pycache__"}]
        found += [Path(root) / f for f in files if f.endswith(".md")]
    return sorted(found)


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks."""
    out, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append((n, line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the text as rendered (links and inline code markup gone),
    lower-cased, every character but letters, digits, '-', '_' and spaces dropped, spaces
    turned into '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)      # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    text = text.strip().lower()
    kept = "".join(ch for ch in text if ch in "-_ " or unicodedata.category(ch)[0] in "LN")
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose_lines(path.read_text(encoding="utf-8")):
        if m := HEADING.match(line):
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every link and image outside code (fenced blocks and `inline code`)."""
    out = []
    for n, line in prose_lines(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)
        out += [(n, m.group(1)) for m in LINK.finditer(line)]
    return out


def runnable_blocks(path: Path) -> list[tuple[int, str]]:
    """(line of the marker, the block's text) for every block marked runnable in PATH."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out = []
    for i, line in enumerate(lines):
        if line.strip() != RUNNABLE:
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```bash":
            raise AssertionError(f"{path.name}:{i + 1}: {RUNNABLE} must be followed by a ```bash block")
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise AssertionError(f"{path.name}:{i + 1}: the runnable block is not closed")
        out.append((i + 1, "\n".join(lines[i + 2:end]) + "\n"))
    return out

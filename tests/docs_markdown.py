"""The project's Markdown as the docs tests read it: which files, their links, their headings'
anchors (GitHub's rules), the files they cite, their command blocks, and the blocks they mark
as runnable.

A runnable block is a fenced `bash` block right after a line `<!-- runnable -->`. It is what a
reader pastes into a shell at the repository's root after `make setup && . .venv/bin/activate`,
with the README's two exports naming a sandbox (`make sandbox`): `EMBEDDINGS_API_KEY` and
`BASE_URL`. It makes whatever else it needs (its corpus included) and writes inside the root.
tests/e2e/test_docs_runnable.py runs each one so, in a fresh stand-in for the root (checkout());
the Airflow guide's in `make airflow-test`. Mark only blocks that are safe and take seconds.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
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


def fenced_blocks(path: Path) -> list[tuple[int, str, str]]:
    """(line of the opening fence, its info string, the block's text) of every fenced block."""
    out, start, info, body = [], None, "", []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line.lstrip()):
            if start is None:
                start, info, body = n, line.strip().strip("`~").strip(), []
            else:
                out.append((start, info, "\n".join(body) + "\n"))
                start = None
        elif start is not None:
            body.append(line)
    return out


def checkout(root: Path) -> Path:
    """ROOT made a stand-in for the repository's root after `make setup`: a link to each
    top-level entry git tracks, and `.venv` to the virtualenv running the tests. Nothing else:
    no corpus, no out/; what a block writes stays in ROOT."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True).stdout
    for name in sorted({f.split("/", 1)[0] for f in listed.decode().split("\0") if f}):
        (root / name).symlink_to(REPO / name)
    (root / ".venv").symlink_to(sys.prefix)
    return root


def shell_env(base_url: str, key: str) -> dict[str, str]:
    """The environment of a shell after `. .venv/bin/activate` and the README's exports of
    EMBEDDINGS_API_KEY and BASE_URL (a sandbox's): no PYTHONPATH, no Airflow settings."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME") and not k.startswith("AIRFLOW")}
    env.update(VIRTUAL_ENV=sys.prefix, PATH=f"{Path(sys.prefix) / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
               EMBEDDINGS_API_KEY=key, BASE_URL=base_url)
    return env


def run_block(block: str, root: Path, env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """BLOCK as pasted into bash at ROOT; any command that fails fails it (-e, pipefail)."""
    return subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


URL = re.compile(r"[a-z][a-z0-9+.-]*://\S+", re.I)
CITED = re.compile(r"(?<![\w.:/-])((?:\.\./)*(?:/?[\w.-]+/)*[\w.-]+\.(?:md|py|ya?ml|in|txt|lock|toml|ini|json|png))(?![\w/-])")
TOP = {"configs", "docs", "embedpipe", "pipeline", "service", "tests", "tools", "transforms"}


def cited_files(path: Path) -> list[tuple[int, str]]:
    """(line, path) of every file PATH's text names that must be in the repository: any
    Markdown file, and a path under one of its top-level directories or starting with ../
    (prose, code and command blocks alike; links and URLs aside). A name with a placeholder in it
    (`configs/profiles/NAME.yaml`, `*`) is not one."""
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in CITED.finditer(URL.sub(" ", LINK.sub(" ", line))):   # links: checked as links
            name = m.group(1)
            parts = name.split("/")
            if any(re.fullmatch(r"[A-Z][A-Z_]+(\.\w+)?", p) and not p.endswith(".md") for p in parts):
                continue
            if name.endswith(".md") or parts[0] in TOP or parts[0] == "..":
                out.append((n, name))
    return out


def resolves(doc: Path, name: str) -> bool:
    """NAME, as DOC cites it, is a file of the repository: beside DOC, or from the root."""
    for base in (doc.parent, REPO):
        found = (base / name).resolve()
        if found.is_relative_to(REPO) and found.exists():
            return True
    return False

"""The docs stay true: every relative link and anchor resolves, every runnable block is well
formed (tests/e2e/test_docs_runnable.py runs them), and every flag of `run --help` and
`plan --help` is explained somewhere a user reads."""
from __future__ import annotations

import re
from urllib.parse import unquote

import pytest

from pipeline.cli import main
from tests.docs_markdown import all_markdown, anchors, links, runnable_blocks, slug, user_docs
from tests.side_venv import REPO

EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)   # https:, mailto:, ...


def _broken(path) -> list[str]:
    out = []
    for line, target in links(path):
        if EXTERNAL.match(target):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        where = f"{path.relative_to(REPO)}:{line}: {target}"
        if not dest.exists():
            out.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and unquote(anchor) not in anchors(dest):
            out.append(f"{where} (no heading with that anchor)")
    return out


@pytest.mark.parametrize("path", all_markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_and_anchor_resolves(path):
    assert _broken(path) == []


def test_github_anchor_rules():
    assert slug("Object stores: s3:// and gs://") == "object-stores-s3-and-gs"
    assert slug("`--sync`: the same command every day") == "--sync-the-same-command-every-day"
    assert slug("Reconciliation over DIR's whole history") == "reconciliation-over-dirs-whole-history"
    assert slug("What the exit codes mean to the DAG") == "what-the-exit-codes-mean-to-the-dag"
    assert slug("summary.json") == "summaryjson"


def test_runnable_blocks_are_marked_bash_blocks():
    blocks = [b for p in user_docs() for b in runnable_blocks(p)]
    assert blocks, "the docs mark no runnable block"
    readme = runnable_blocks(REPO / "README.md")
    assert readme and "pipeline run" in readme[0][1] and "pipeline plan" in readme[0][1]


def _flags(command: str, capsys) -> set[str]:
    """The flags `python -m pipeline COMMAND --help` prints (Beam's own, with underscores, aside)."""
    assert main([command, "--help"]) == 0
    return set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*[a-z0-9])(?!\w)", capsys.readouterr().out))


@pytest.mark.parametrize("command", ["run", "plan"])
def test_every_flag_of_the_help_is_in_the_docs(command, capsys):
    text = "\n".join(p.read_text(encoding="utf-8") for p in user_docs())
    flags = _flags(command, capsys)
    assert {"--input", "--output", "--sync", "--max-spend-rub"} <= flags
    missing = sorted(f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text))
    assert missing == [], f"flags of `{command} --help` that no doc mentions"

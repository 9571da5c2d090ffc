"""The docs stay true: every relative link and anchor resolves, every file they name is in the
repository, every runnable block is well formed and says so (tests/e2e/test_docs_runnable.py
runs them), every command line of a block the tests cannot run is one the command's own parser
reads, and every flag of `run --help` and `plan --help` is explained somewhere a user reads."""
from __future__ import annotations

import argparse
import re
import shlex
from urllib.parse import unquote

import pytest

from pipeline import cli
from pipeline.cli import main
from pipeline.exits import UsageError
from pipeline.settings import options, profiles
from pipeline.settings.config import default_settings_text, parse_settings
from service.sandbox.config import build_parser as sandbox_parser
from tests.docs_markdown import (all_markdown, anchors, cited_files, fenced_blocks, links, prose_lines, resolves,
                                 runnable_blocks, slug, user_docs)
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


@pytest.mark.parametrize("path", all_markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_file_the_docs_name_is_in_the_repository(path):
    """A Markdown file named anywhere (`spec/service-api.md`, `../shared/design.md`), or a path
    under a top-level directory (`tests/airflow/requirements.txt`), is one a reader can open."""
    missing = [f"{path.relative_to(REPO)}:{line}: {name}" for line, name in cited_files(path)
               if not resolves(path, name)]
    assert missing == []


def test_the_citation_check_finds_what_is_not_there(tmp_path):
    doc = REPO / "docs" / "corpus.md"
    cited = [name for _, name in cited_files(doc)]
    assert "outputs.md" not in cited   # a link: checked by the link test
    assert resolves(doc, "money.md") and resolves(doc, "configs/pipeline.yaml") and resolves(doc, "../README.md")
    assert not resolves(doc, "spec/service-api.md") and not resolves(doc, "../../shared/design.md")
    fake = tmp_path / "x.md"
    fake.write_text("see `spec/service-api.md`, what-the-spec-leaves-open.md and ../shared/design.md;\n"
                    "configs/profiles/NAME.yaml and https://example.org/a.md are not citations\n")
    assert [name for _, name in cited_files(fake)] == [
        "spec/service-api.md", "what-the-spec-leaves-open.md", "../shared/design.md"]


def test_github_anchor_rules():
    assert slug("Object stores: s3:// and gs://") == "object-stores-s3-and-gs"
    assert slug("`--sync`: the same command every day") == "--sync-the-same-command-every-day"
    assert slug("Reconciliation over DIR's whole history") == "reconciliation-over-dirs-whole-history"
    assert slug("What the exit codes mean to the DAG") == "what-the-exit-codes-mean-to-the-dag"
    assert slug("summary.json") == "summaryjson"


GUIDES = [*user_docs(), REPO / "configs" / "airflow" / "README.md"]


def test_runnable_blocks_are_marked_bash_blocks():
    blocks = [b for p in GUIDES for b in runnable_blocks(p)]
    assert blocks, "the docs mark no runnable block"
    readme = runnable_blocks(REPO / "README.md")
    assert readme and "pipeline run" in readme[0][1] and "pipeline plan" in readme[0][1]


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: str(p.relative_to(REPO)))
def test_a_runnable_block_says_so_to_the_reader(path):
    """The marker is invisible once rendered: the paragraph before it tells the reader."""
    lines = path.read_text(encoding="utf-8").splitlines()
    for line, _ in runnable_blocks(path):
        lead = " ".join(lines[max(0, line - 5):line - 1])
        assert "runs as pasted" in lead, f"{path.name}:{line}: say that the block runs as pasted"


def test_the_sandbox_the_docs_point_at_is_make_sandbox():
    """README's exports for a `make sandbox` (the runnable blocks' setting) name its port and key."""
    makefile = (REPO / "Makefile").read_text()
    port = re.search(r"^SANDBOX_PORT \?= (\d+)$", makefile, re.M).group(1)
    key = re.search(r"--key \$\$\{EMBEDDINGS_API_KEY:-([\w-]+)\}", makefile).group(1)
    readme = (REPO / "README.md").read_text()
    assert f"export EMBEDDINGS_API_KEY={key} BASE_URL=http://127.0.0.1:{port}/v1" in readme
    assert f"port {port}" in readme and f"`{key}`" in readme


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


def test_every_setting_the_docs_name_is_one(tmp_path):
    """`section.key` in a doc is a key of configs/pipeline.yaml (what --run-config takes)."""
    settings = parse_settings(default_settings_text())
    sections = {name: vars(section) for name, section in vars(settings).items()}
    named = re.compile(r"`(" + "|".join(sections) + r")\.([a-z0-9_]+)`")
    wrong = [f"{p.relative_to(REPO)}:{n}: {m.group(1)}.{m.group(2)}" for p in GUIDES
             for n, line in prose_lines(p.read_text(encoding="utf-8"))
             for m in named.finditer(line) if m.group(2) not in sections[m.group(1)] and m.group(2) != "py"]
    assert wrong == []
    assert named.search("`client.max_attempts`") and "max_attempts" in sections["client"]


class _Read(Exception):
    """A command's arguments were all read: it would start its work here."""


def _read_only(flags: list[str], read_by_workers=()) -> None:
    """command_options without its effects: the profile, every flag known, the values well formed,
    Beam's own checks of the options (the runner, its validator)."""
    flags = profiles.expand(flags)
    if unknown := options.unknown_flags(flags):
        raise UsageError(f"unknown option(s): {', '.join(unknown)}")
    options.check_beam(options.EmbedPipeOptions(flags))
    raise _Read


def read_error(argv: list[str], monkeypatch, capsys) -> str | None:
    """None when `python -m pipeline ARGV` or `python -m service.sandbox ARGV` (ARGV[0] "sandbox")
    would be read without an error by the command's own parser; else what it says. Nothing runs."""
    command, rest = argv[0], argv[1:]
    if {"-h", "--help"} & set(rest) or command in ("demo", "beam-options"):
        return None if command in cli.COMMANDS else f"unknown command {command}"
    try:
        if command == "sandbox":
            parser = argparse.ArgumentParser() if rest[:1] == ["ledger"] else sandbox_parser()
            if rest[:1] == ["ledger"]:
                parser.add_argument("--db", required=True)
            parser.parse_args(rest[1:] if rest[:1] == ["ledger"] else rest)
            return None
        if command == "psql":   # psql's own arguments follow DIR
            return None if rest and not rest[0].startswith("-") else "psql: DIR first"
        if command not in ("run", "plan", "report", "compare", "publish", "search"):
            return f"unknown command {command}"
        monkeypatch.setattr(options, "command_options", _read_only)
        code = _read_only(rest) if command in ("run", "plan") else cli.COMMANDS[command](rest)
        return f"exit {code}: {capsys.readouterr().err.strip()[-300:]}"
    except _Read:
        return None
    except UsageError as exc:
        return str(exc)
    except SystemExit as exc:   # argparse
        return f"exit {exc.code}: {capsys.readouterr().err.strip()[-300:]}"


COMMAND = re.compile(r"^(?:\w+=\S+\s+)*(?:python -m (pipeline|service\.sandbox)|(embedpipe))\s+(.*)$")
PLACEHOLDER = re.compile(r"<[a-z][\w .-]*>")        # <beam version>
ALTERNATIVES = re.compile(r"(?<=[\w.-])\|[\w.|-]+")   # local|dataflow|flink: the first


def command_lines(path) -> list[tuple[int, list[str]]]:
    """(line, argv) of every `python -m pipeline`, `embedpipe` and `python -m service.sandbox`
    command in PATH's shell blocks, as a shell would split it: continuations joined, comments,
    redirections and what follows a pipe left out, [optional] parts kept, `...` dropped (or a
    value where a flag needs one)."""
    found = []
    for start, info, text in fenced_blocks(path):
        if info not in ("", "bash", "sh", "shell"):
            continue
        lines = text.splitlines()
        for offset, line in enumerate(lines):
            m = COMMAND.match(line.strip())
            if not m:
                continue
            command, rest, more = m.group(1) or m.group(2), m.group(3), iter(lines[offset + 1:])
            while True:   # a continued line, or a quoted string over lines, goes on as in a shell
                try:
                    if rest.endswith("\\"):
                        rest = rest[:-1] + next(more)
                        continue
                    shlex.split(rest, comments=True)
                    break
                except ValueError:
                    rest += "\n" + next(more)
            found.append((start + offset + 1, _argv(command, rest)))
    return found


def _argv(command: str, rest: str) -> list[str]:
    words = shlex.shlex(ALTERNATIVES.sub("", PLACEHOLDER.sub("X", rest)), posix=True, punctuation_chars="|&;<>")
    words.whitespace_split = True
    argv = ["sandbox"] if command == "service.sandbox" else []
    for word in words:
        if word[:1] in "|&;<>":
            break
        word = word.strip("[]")
        if word == "...":
            if argv and argv[-1].startswith("--") and "=" not in argv[-1]:
                argv.append("X")
        elif word:
            argv.append(word)
    return argv


COMMAND_DOCS = [p for p in all_markdown() if command_lines(p)]


@pytest.mark.parametrize("path", COMMAND_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_command_line_of_the_docs_is_read_by_its_parser(path, monkeypatch, capsys):
    """Blocks the tests cannot run (Dataflow, Flink, a server that serves until stopped, a
    synopsis) are checked this way; runnable ones too, before they run."""
    wrong = [f"{path.relative_to(REPO)}:{line}: {shlex.join(argv)}: {error}" for line, argv in command_lines(path)
             if (error := read_error(argv, monkeypatch, capsys))]
    assert wrong == []


def test_the_command_check_catches_a_wrong_flag(monkeypatch, capsys):
    assert read_error(["run", "--profile", "dataflow", "--input", "gs://b/c", "--output", "gs://b/o"],
                      monkeypatch, capsys) is None
    assert "--max-spend-rub" in read_error(["run", "--max-spend", "5"], monkeypatch, capsys)
    assert "invalid float" in read_error(["plan", "--max-spend-rub", "RUB"], monkeypatch, capsys)
    assert read_error(["compare", "out/", "--smaple", "5"], monkeypatch, capsys)
    assert read_error(["sandbox", "--port", "8780", "--capacity-mode", "never"], monkeypatch, capsys)

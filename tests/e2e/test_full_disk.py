"""A full disk under --output, for real: DIR on a small tmpfs of its own, filled to leave a few
bytes at the moment that matters. Each time: one line naming DIR and what to free, exit 1, no
traceback, the served view whole; after space is freed the same command completes, nothing is
paid twice, and no temporary file of the failed run is left."""
from __future__ import annotations

import logging
import os
import re
import tempfile
from pathlib import Path

import pytest
import yaml

from pipeline.outdir.space import free_bytes
from tests.conftest import SANDBOX_KEY, fill, make_free
from tests.e2e.money_helpers import (billed_twice, corpus_rows, current, kill_once_journaled, ledger, run,
                                     start_sandbox, summary, write_corpus, write_models)

TEMPORARY = (".tmp-", ".temp-", ".space", ".write-probe-")
PROCESSES = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing")


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def temporary_files(out: Path) -> list[str]:
    found = [str(p.relative_to(out)) for p in out.rglob("*") if any(t in p.name for t in TEMPORARY)]
    return found + [str(p.relative_to(out)) for p in (out / "_journal", out / "_progress") if p.exists()]


def one_line(caplog, capsys) -> str:
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, [r.getMessage() for r in errors]
    line = errors[0].getMessage()
    assert "\n" not in line and not errors[0].exc_info and "Traceback" not in capsys.readouterr().err
    return line


def one_line_about(out: Path, caplog, capsys) -> str:
    line = one_line(caplog, capsys)
    assert f"--output {out}: no space left on its disk" in line and "MB free" in line
    return line


def wide_models(path: Path, dimensions: int = 256) -> Path:
    """Longer vectors and fuller requests than money_helpers' catalogue: the view's files weigh
    what a commit must rewrite, the run stays a few seconds."""
    write_models(path)
    doc = yaml.safe_load(path.read_text())
    doc["models"]["text-embedding-3-small"].update(dimensions=dimensions, max_inputs_per_request=64,
                                                   max_tokens_per_request=8192)
    path.write_text(yaml.safe_dump(doc))
    return path


def to_free(line: str) -> int:
    """The bytes the message says to free."""
    found = re.search(r"Free (\d+) MB more there", line)
    assert found, line
    return int(found.group(1)) << 20


def test_the_start_record_with_4_kb_free_is_one_line(tmp_path, small_disk, sandbox_factory, env_key, caplog, capsys):
    rows = corpus_rows(n_short=40, n_long=1)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    out = small_disk / "out"
    out.mkdir()
    filler = fill(small_disk, 4096)
    assert run(corpus, out, sb, models) == 1
    line = one_line_about(out, caplog, capsys)
    assert "run the same command again with --resume" in line
    assert ledger(sb) == [] and temporary_files(out) == [] and not (out / "_lock.json").exists()
    make_free(small_disk, filler, free_bytes(small_disk) + to_free(line))
    assert run(corpus, out, sb, models, "--resume") == 0   # the message's next step, verbatim
    assert summary(out)["pending"] == 0 and billed_twice(ledger(sb)) == {}


def test_a_commit_on_a_full_disk_keeps_the_served_view(tmp_path, small_disk, sandbox_factory, env_key, caplog,
                                                       capsys):
    rows = corpus_rows(n_short=600, n_long=0)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), wide_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    out = small_disk / "out"
    assert run(corpus, out, sb, models) == 0
    manifest, served = (out / "_current.json").read_text(), sorted(p.name for p in (out / "current").iterdir())
    paid, embedded = len(ledger(sb)), current(out, "embeddings").num_rows
    day1 = {p.name for p in (out / "history").iterdir()}
    write_corpus(corpus, rows[100:])   # day 2: documents removed, nothing to pay; the commit rewrites the view
    filler = fill(small_disk, 256 << 10)
    caplog.clear()
    capsys.readouterr()
    assert run(corpus, out, sb, models, "--sync") == 1
    line = one_line_about(out, caplog, capsys)
    day2, = {p.name for p in (out / "history").iterdir()} - day1   # run ids of one second do not sort by time
    assert list((out / "history" / day2).glob("requests-*.parquet")), "the job did not finish: not the commit"
    # the served view is day 1's, whole
    assert (out / "_current.json").read_text() == manifest
    assert sorted(p.name for p in (out / "current").iterdir()) == served
    assert current(out, "embeddings").num_rows == embedded
    make_free(small_disk, filler, free_bytes(small_disk) + to_free(line))
    assert run(corpus, out, sb, models, "--sync") == 0
    assert len(ledger(sb)) == paid and current(out, "embeddings").num_rows == embedded - 100
    assert temporary_files(out) == []


def test_a_killed_run_leaves_nothing_after_the_next_one(tmp_path, sandbox_factory, env_key):
    """The journal of a killed run, its job's temporary files, an old probe: gone after the next
    run, whose figures (and the one after it) still name what the kill lost."""
    rows = corpus_rows(n_short=80, n_long=1)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models, args=["--latency-ms", "150"])
    out = tmp_path / "out"
    kill_once_journaled(corpus, out, sb, models, tmp_path / "job.log", 3, "--max-in-flight", "2")
    probe = out / ".write-probe-left"
    probe.write_bytes(b"ok")
    os.utime(probe, (1, 1))
    assert (out / "_journal").exists() and temporary_files(out)
    fast = start_sandbox(sandbox_factory, models, db=sb.db)
    assert run(corpus, out, fast, models, "--resume") == 0
    assert temporary_files(out) == []
    first = summary(out)["reconciliation"]
    assert run(corpus, out, fast, models, "--resume") == 0   # nothing to do: the same figures
    again = summary(out)["reconciliation"]
    assert first["unexplained_rub"] == again["unexplained_rub"] == 0
    assert (again["lost"], again["balance_delta_rub"]) == (first["lost"], first["balance_delta_rub"])


def _wide_view(tmp_path, disk, sandbox_factory):
    """A view of a few MB (600 documents at 1,536 dimensions) on a 24 MB disk of its own:
    (rows, corpus, models, sandbox, the disk, DIR)."""
    rows = corpus_rows(n_short=600, n_long=0)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), wide_models(tmp_path / "models.yaml", 1536)
    sb = start_sandbox(sandbox_factory, models)
    mount = disk(24)
    out = mount / "out"
    assert run(corpus, out, sb, models) == 0
    return rows, corpus, models, sb, mount, out


def test_a_commit_that_rewrites_the_view_says_what_to_free_and_passes_once_it_is(tmp_path, disk, sandbox_factory,
                                                                                  env_key, caplog, capsys):
    """One document edited in a view of a few MB (an input of that document, --resume): the
    commit rewrites the file that holds it.
    The message counts that file (not only the run's rows), the failed commit's own files are
    gone at once, and freeing what the message says lets the same command pass."""
    rows, corpus, models, sb, mount, out = _wide_view(tmp_path, disk, sandbox_factory)
    paid, day1 = len(ledger(sb)), {p.name for p in (out / "history").iterdir()}
    edited = write_corpus(tmp_path / "edited.parquet", [dict(rows[7], text=rows[7]["text"] + " edited")])
    filler = fill(mount, 2 << 20)
    caplog.clear()
    capsys.readouterr()
    assert run(edited, out, sb, models, "--resume") == 1   # the other documents stay
    line = one_line_about(out, caplog, capsys)
    day2, = {p.name for p in (out / "history").iterdir()} - day1   # run ids of one second do not sort by time
    assert list((out / "history" / day2).glob("requests-*.parquet")), "the job did not finish: not the commit"
    assert not [p.name for p in (out / "_segments").glob(f"*{day2}*")], "the failed commit's files stay"
    make_free(mount, filler, free_bytes(mount) + to_free(line))   # as the message says, no more
    assert run(edited, out, sb, models, "--resume") == 0, caplog.text[-2000:]
    assert len(ledger(sb)) == paid + 1 and temporary_files(out) == []
    assert current(out, "embeddings").num_rows == len(rows) - 1   # the empty text failed


@pytest.mark.parametrize("leave", [64 << 10, 8 << 10])   # full while the workers claim texts; full at once
def test_a_full_temporary_directory_is_named_not_the_output(tmp_path, disk, sandbox_factory, env_key, monkeypatch,
                                                            caplog, capsys, leave):
    """The local worker processes share their claims through a file in the temporary
    directory: when its disk fills, the line names it with its free space, not --output (which
    has room), and freeing it lets the same command complete."""
    temp = disk(8)
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert tempfile.gettempdir() == str(temp)   # chosen while it has room: Python skips a full one
    rows = corpus_rows(n_short=300, n_long=3)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    filler = fill(temp, leave)
    assert run(corpus, out, sb, models, *PROCESSES) == 1
    line = one_line(caplog, capsys)
    assert f"no space left on the temporary directory {temp}, " in line and "MB free of 8.0 MB" in line, line
    assert f"not on --output {out}'s, " in line and "set TMPDIR to a directory on a disk with room" in line
    assert "then run the same command again with --resume" in line
    os.remove(filler)
    assert run(corpus, out, sb, models, "--resume", *PROCESSES) == 0
    assert summary(out)["pending"] == 0 and billed_twice(ledger(sb)) == {}


def test_a_killed_commits_files_are_removed_when_the_next_run_starts(tmp_path, disk, sandbox_factory, env_key):
    """A commit killed half-way leaves its segments (no view holds them): the next run removes
    them before its own commit needs the room, not only after it succeeded."""
    rows, corpus, models, sb, mount, out = _wide_view(tmp_path, disk, sandbox_factory)
    stale = out / "_segments" / "embeddings-20200101T000000Z-0dead0-00000.parquet"
    with open(stale, "wb") as fh:
        os.posix_fallocate(fh.fileno(), 0, 8 << 20)
    fill(mount, 1 << 20)   # the edit's commit rewrites a file of ~4 MB: it fits once the stale segment is gone
    edited = write_corpus(tmp_path / "edited.parquet", [dict(rows[7], text=rows[7]["text"] + " edited")])
    assert run(edited, out, sb, models, "--resume") == 0
    assert not stale.exists()

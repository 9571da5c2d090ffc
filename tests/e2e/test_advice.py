"""Every message that says what to do next works when followed verbatim, for every exit code:
the next command is built only from what the message says (plus fixing the cause it names),
and following the advice until it stops finishes the job, paying for no text twice."""
from __future__ import annotations

import logging
import re

import pytest

from pipeline.cli import main
from tests.conftest import SANDBOX_KEY
from tests.e2e.money_helpers import (MODEL, assert_every_row_once, billed_twice, corpus_rows, ledger, start_sandbox,
                                     write_corpus, write_models)


def follow(argv: list[str], advice: str) -> list[str]:
    """The command ADVICE asks for: a flag it says to pass, or the flag it suggests for a typo."""
    if m := re.search(r"(--[\w-]+) \(did you mean (--[\w-]+)\?\)", advice):
        return [m.group(2) if a == m.group(1) else a for a in argv]
    added = [flag for flag in re.findall(r"(?:pass|with) (--[\w-]+)", advice) if flag not in argv]
    assert added or "--resume" in argv, f"no command in the advice: {advice}"
    return argv + added[:1]  # "pass --a, or --b": the first one offered


class Runner:
    def __init__(self, caplog):
        self.caplog = caplog

    def __call__(self, argv: list[str]) -> tuple[int, str]:
        self.caplog.clear()
        with self.caplog.at_level(logging.INFO):
            code = main(["run", *argv])
        # the CLI's own last word: an error, or a warning for a stop the budget made (exit 3, 4)
        said = [r.getMessage() for r in self.caplog.records if r.levelno >= logging.WARNING and r.name == "embedpipe"]
        assert code == 0 or said, f"exit {code} without a message"
        return code, said[-1] if said else ""


@pytest.fixture
def job(tmp_path, sandbox_factory, monkeypatch, caplog):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    rows = corpus_rows(n_short=30, n_long=1)
    corpus, models = write_corpus(tmp_path / "corpus.parquet", rows), write_models(tmp_path / "models.yaml")
    sb = start_sandbox(sandbox_factory, models)
    argv = ["--input", str(corpus), "--output", str(tmp_path / "out"), "--model", MODEL,
            "--base-url", sb.base_url, "--models-config", str(models)]
    return argv, rows, sb, models, tmp_path / "out", Runner(caplog)


def finish(run, argv: list[str], first: tuple[int, str], limit: int = 8) -> list[int]:
    """Follow the advice from FIRST until an exit 0; the exit codes met on the way."""
    codes, (code, advice) = [first[0]], first
    while code != 0:
        assert len(codes) < limit, f"still exit {code} after {codes}: {advice}"
        argv = follow(argv, advice)
        code, advice = run(argv)
        codes.append(code)
    return codes


def done(out, rows, sb) -> None:
    assert assert_every_row_once(out, rows)["pending"] == 0
    assert billed_twice(ledger(sb)) == {}


def test_exit_3_then_allow_partial_then_exit_4_then_resume_until_done(job):
    argv, rows, sb, _, out, run = job
    argv = argv + ["--max-spend-rub", "0.15"]
    first = run(argv)
    assert first[0] == 3 and ledger(sb) == []
    codes = finish(run, argv, first)
    assert codes[:2] == [3, 4] and codes[-1] == 0, codes
    done(out, rows, sb)


def test_exit_3_then_a_higher_cap_on_the_same_output(job):
    argv, rows, sb, _, out, run = job
    assert run(argv + ["--max-spend-rub", "0.001"])[0] == 3
    assert run(argv + ["--max-spend-rub", "10"]) == (0, "")  # "Raise --max-spend-rub"
    done(out, rows, sb)


def test_exit_2_results_already_there_then_resume(job):
    argv, rows, sb, _, out, run = job
    assert run(argv)[0] == 0
    paid = len(ledger(sb))
    code, advice = run(argv)
    assert code == 2
    assert finish(run, argv, (code, advice)) == [2, 0]
    assert len(ledger(sb)) == paid
    done(out, rows, sb)


def test_exit_2_misspelt_flag_then_the_suggestion(job):
    argv, rows, sb, _, out, run = job
    code, advice = run(argv + ["--max-spend-rubb", "10"])
    assert code == 2 and ledger(sb) == []
    assert finish(run, argv + ["--max-spend-rubb", "10"], (code, advice)) == [2, 0]
    done(out, rows, sb)


def test_exit_2_no_key_then_an_api_key_file(job, monkeypatch, tmp_path):
    argv, rows, sb, _, out, run = job
    monkeypatch.delenv("EMBEDDINGS_API_KEY")
    code, advice = run(argv)
    assert code == 2 and "--api-key-file PATH" in advice
    key_file = tmp_path / "key"
    key_file.write_text(SANDBOX_KEY)
    assert run(argv + ["--api-key-file", str(key_file)]) == (0, "")  # the PATH it asks for
    done(out, rows, sb)


def test_exit_1_key_refused_then_the_right_key(job, monkeypatch):
    argv, rows, sb, _, out, run = job
    monkeypatch.setenv("EMBEDDINGS_API_KEY", "sk-wrong")
    code, advice = run(argv)
    assert code == 1 and "EMBEDDINGS_API_KEY" in advice and ledger(sb) == []
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)  # the cause it names, fixed
    assert run(argv) == (0, "")
    done(out, rows, sb)


def test_exit_1_key_revoked_mid_run_then_resume(job, sandbox_factory):
    argv, rows, sb, models, out, run = job
    sb.stop()
    revoked = start_sandbox(sandbox_factory, models, db=sb.db, args=["--revoke-after", "3"])
    argv = [revoked.base_url if a == sb.base_url else a for a in argv]
    code, advice = run(argv)
    assert code == 1 and "--resume" in advice, advice
    revoked.stop()
    fixed = start_sandbox(sandbox_factory, models, db=sb.db)  # the key works again
    argv = [fixed.base_url if a == revoked.base_url else a for a in argv]
    assert finish(run, argv, (code, advice)) == [1, 0]
    done(out, rows, fixed)

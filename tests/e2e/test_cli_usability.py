"""A new user's first commands: help that fits a screen, nothing on stderr they did not cause,
and a mistake in a Beam option that ends in one line and exit 2.

The CLI runs as a subprocess (`python -m pipeline`), as a user runs it: what Beam logs at
import time only shows in a fresh interpreter.
"""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import write_corpus

REPO = Path(__file__).resolve().parents[2]
MODEL = "text-embedding-3-small"
SCREEN_LINES = 49   # a laptop's terminal; run's options, grouped, with --publish, --chunk-tokens, --no-chunk-text


def cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def embedpipe(*args: str) -> subprocess.CompletedProcess:
    """The console script pip installs, beside the interpreter."""
    script = Path(sys.executable).with_name("embedpipe")
    return subprocess.run([str(script), *args], cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("run, args", [(cli, ["--help"]), (cli, ["-h"]), (embedpipe, ["--help"]),
                                       (embedpipe, ["-h"]), (cli, ["help"])])
def test_help_is_on_stdout_and_exits_0(run, args):
    done = run(*args)
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert done.stdout.startswith("embedpipe command line: run, plan,")   # `embedpipe --help | less` shows it


@pytest.mark.parametrize("command", ["demo", "report", "compare", "publish", "search", "psql", "beam-options"])
def test_each_commands_help_is_on_stdout_and_exits_0(command):
    done = cli(command, "--help")
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert f"pipeline {command}" in done.stdout or command == "beam-options"
    if command == "search":   # `help COMMAND` is the same
        assert cli("help", command).stdout == done.stdout


def test_help_into_a_reader_that_left_ends_without_a_traceback():
    """`embedpipe --help | head -1`: the reader is gone before the help is written."""
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "--help"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 141 and err == b"", err


def test_version_names_embedpipe_beam_and_python():
    import apache_beam

    for done in (cli("--version"), embedpipe("-V")):
        assert (done.returncode, done.stderr) == (0, ""), done.stderr
        assert done.stdout.startswith("embedpipe 0.1.0 (Apache Beam ") and apache_beam.__version__ in done.stdout
        assert f"Python {sys.version_info.major}.{sys.version_info.minor}." in done.stdout


@pytest.mark.parametrize("typed, says", [("fnord", "the commands are run, plan, demo,"),
                                         ("pubish", "did you mean 'publish'?"), ("serch", "did you mean 'search'?")])
def test_an_unknown_command_is_named_with_the_nearest_one(typed, says):
    done = cli(typed, "DIR")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and f"ERROR embedpipe: unknown command '{typed}': {says}" in lines[0], lines


def test_no_command_prints_the_usage_on_stderr_and_exits_2():
    done = cli()
    assert done.returncode == 2 and done.stdout == "" and done.stderr.startswith("embedpipe command line:")


@pytest.mark.parametrize("command", ["run", "plan"])
def test_help_fits_a_screen_with_the_own_options_grouped(command):
    done = cli(command, "--help")
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert len(lines) <= SCREEN_LINES, len(lines)
    for group in ("input:", "output:", "model:", "budget:", "service:", "advanced:"):
        assert group in lines
    for flag in ("--input PATH", "--model MODEL", "--base-url URL", "--max-spend-rub RUB", "--keep-columns"):
        assert flag in done.stdout
    assert "--dataflow_endpoint" not in done.stdout  # Beam's own options are one command away
    assert "python -m pipeline beam-options" in done.stdout
    assert ("--allow-partial" in done.stdout) == (command == "run")


def test_beam_options_lists_every_beam_option():
    done = cli("beam-options")
    assert done.returncode == 0 and done.stderr == ""
    for flag in ("--runner", "--direct_num_workers", "--s3_endpoint_url", "--project", "--max-spend-rub"):
        assert flag in done.stdout


def test_plan_and_run_print_nothing_unasked(sandbox, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    common = ["--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url]
    plan = cli("plan", *common, "--json")
    assert plan.returncode == 0, plan.stderr
    assert plan.stderr == ""
    run = cli("run", *common, "--output", str(tmp_path / "out"))
    assert run.returncode == 0, run.stderr
    # the one line saying what runs, and the progress lines a pipe gets every embed.progress_interval_s
    logged = [line for line in run.stderr.splitlines() if " INFO embedpipe.progress: read " not in line]
    assert len(logged) == 1 and " INFO embedpipe: run " in logged[0], logged


def test_local_worker_processes_keep_their_harness_chatter_to_themselves(sandbox, tmp_path):
    """Beam's worker harness logs at INFO unless the runner says otherwise: channels, caches,
    options, per process. What is left is what Beam logs before it reads the options (its
    warnings, "Logging handler created")."""
    corpus = write_corpus(tmp_path / "corpus.parquet")
    run = cli("run", "--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url,
              "--output", str(tmp_path / "out"), "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
    assert run.returncode == 0, run.stderr
    for chatter in ("INFO:apache_beam.runners.worker", "Pipeline_options", "Python sdk harness starting"):
        assert chatter not in run.stderr, run.stderr


@pytest.mark.parametrize("flags, words", [
    (["--runner", "NoSuchRunner"], ["--runner NoSuchRunner", "Unexpected pipeline runner"]),
    (["--runner=no.such.module.Runner"], ["--runner no.such.module.Runner", "No module named"]),
    (["--direct_num_workers", "abc"], ["--direct_num_workers", "invalid int value: 'abc'"]),
    (["--direct_running_mode", "fast"], ["--direct_running_mode", "invalid choice"]),
    (["--s3_endpoint_url"], ["--s3_endpoint_url", "expected one argument"]),
    (["--environment_type", "PROCESS"], ["Beam's options", "process_command is required"]),
    pytest.param(["--pickle_library", "dill"], ["--pickle_library dill", "dill is not installed"],
                 marks=pytest.mark.skipif(importlib.util.find_spec("dill") is not None, reason="dill is installed")),
])
def test_a_mistake_in_a_beam_option_is_one_line_and_exit_2(tmp_path, flags, words):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    # nothing listens on the base URL: the mistake must be caught before anything is contacted
    done = cli("plan", "--input", str(corpus), "--model", MODEL, "--base-url", "http://127.0.0.1:9/v1", *flags)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, lines
    for word in words:
        assert word in lines[0]


def test_a_base_url_without_v1_is_named_with_the_one_that_answers(sandbox, tmp_path):
    """The sandbox serves under /v1, as OpenAI-style services do: the line names the URL that
    answers, and the command it gives works as written."""
    corpus = write_corpus(tmp_path / "corpus.parquet")
    root = sandbox.base_url.removesuffix("/v1")
    for typed in (root, root + "/", root + "/api"):
        done = cli("plan", "--input", str(corpus), "--model", MODEL, "--base-url", typed)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].endswith(f"answers: pass --base-url {sandbox.base_url}"), lines
    assert cli("plan", "--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url).returncode == 0
    # a 404 that no /v1 explains (the account segment): what to check, no URL guessed
    done = cli("plan", "--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url,
               "--account-segment", "billing")
    assert done.returncode == 2 and "check --base-url" in done.stderr and "--account-segment (billing)" in done.stderr
    assert "pass --base-url" not in done.stderr


def test_a_model_name_a_letter_off_is_named_with_the_nearest(tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    # nothing listens on the base URL: the model is checked before anything is contacted
    done = cli("plan", "--input", str(corpus), "--model", "text-embedding-3-smal", "--base-url", "http://127.0.0.1:9/v1")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "unknown model 'text-embedding-3-smal' (did you mean 'text-embedding-3-small'?); known: " in done.stderr


def test_an_overlap_given_as_a_flag_is_named_by_its_flag(tmp_path):
    """The flag the user typed, not the config key; one set in a config keeps the key's name."""
    corpus = write_corpus(tmp_path / "corpus.parquet")
    base = ("plan", "--input", str(corpus), "--model", "text-embedding-3-small", "--base-url", "http://127.0.0.1:9/v1",
            "--chunk-tokens", "40")
    done = cli(*base, "--overlap-tokens", "20")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert "--overlap-tokens must be between 0 and a quarter of the chunk's 40 tokens (10), got 20" in done.stderr
    config = tmp_path / "pipeline.yaml"
    config.write_text("split:\n  overlap_tokens: 20\n")
    done = cli(*base, "--run-config", str(config))
    assert done.returncode == 2 and "split settings: overlap_tokens must be between" in done.stderr, done.stderr

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
    logged = run.stderr.splitlines()
    assert len(logged) == 1 and " INFO embedpipe: run " in logged[0], logged  # the one line saying what runs


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

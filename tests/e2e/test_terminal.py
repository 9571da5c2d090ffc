"""`python -m pipeline run` as a person and as a scheduler see it, each a real process against
the sandbox. On a pseudo-terminal: a live bar (carriage returns, the bar's fields), log records
written above it rather than through it, and the short summary with what to do next, shown
once. In a pipe (Airflow, CI): the log lines of old, no control characters, and with --json
the whole summary on stdout.

The sandbox answers one embeddings attempt in five with a 500, seeded so that the first one
fails (seed 1 draws 0.13 first, under the rate): the client logs retry warnings while the bar is up."""
from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import re
import select
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import termios
import time

import pytest
import yaml

from pipeline.terminal.figures import rub
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import summary
from tests.e2e.money_helpers import MODEL, REPO, corpus_rows, write_corpus, write_models

COLUMNS, ROWS = 120, 40
DEADLINE_S = 240
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: ")
RETRY_WARNING = re.compile(r"^\S+ \S+ WARNING service\.client: POST /embeddings attempt 1/\d+ failed \(HTTP 500\); "
                           r"retrying in [\d.]+ s \[request_id=\w+\]$")
BAR = re.compile(r"^\s*(?P<percent>\d+)%\|.*\| (?P<documents>[\d,]+)/(?P<total>[\d,]+) docs, (?P<answered>[\d,]+)/"
                 r"(?P<planned>[\d,]+) requests? \[[\d:]+<[\d:?]+, [\d,?]+ req/s\] (?P<rub>[\d.,]+)/[\d.,]+ RUB "
                 r"\| (?P<chunks>[\d,]+) chunks, (?P<tokens>\S+) tokens$")


@pytest.fixture
def job(tmp_path, sandbox_factory):
    """The argv of a run that stops when its budget runs out (exit 4), one request at a time
    (the sandbox's faults follow the order of the requests), with a progress report every 0.1 s."""
    models = write_models(tmp_path / "models.yaml")
    corpus = write_corpus(tmp_path / "corpus.parquet", corpus_rows(n_short=60, n_long=1))
    settings = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    settings["embed"]["progress_interval_s"] = 0.1
    settings["client"].update(initial_backoff_s=0.05, max_backoff_s=0.2)
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(settings))
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--models", str(models), "--latency-ms", "150",
                                                               "--rate-500", "0.2", "--seed", "1"])
    return [sys.executable, "-m", "pipeline", "run", "--input", str(corpus), "--model", MODEL,
            "--base-url", sb.base_url, "--models-config", str(models), "--run-config", str(tmp_path / "pipeline.yaml"),
            "--max-in-flight", "1", "--max-spend-rub", "0.2", "--allow-partial"]


def env() -> dict[str, str]:
    return {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}


def on_a_terminal(argv: list[str]) -> tuple[int, str]:
    """Run ARGV with stdin, stdout and stderr on a pseudo-terminal of COLUMNS x ROWS; (exit code,
    everything it wrote)."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env(),
                            start_new_session=True)
    os.close(slave)
    written, deadline = b"", time.monotonic() + DEADLINE_S
    try:
        while time.monotonic() < deadline:
            if select.select([master], [], [], 0.2)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                written += chunk
            elif proc.poll() is not None:
                break
        else:
            os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait(30), written.decode()
    finally:
        os.close(master)


def screen(written: str) -> list[str]:
    """The lines a terminal shows after WRITTEN: a carriage return goes back to the start of the
    line and what follows overwrites it (all a bar and log lines use)."""
    rows, row, col = [""], 0, 0
    for ch in written:
        if ch == "\n":
            row, col = row + 1, 0
            rows += [""] * (row + 1 - len(rows))
        elif ch == "\r":
            col = 0
        else:
            line = rows[row].ljust(col)
            rows[row], col = line[:col] + ch + line[col + 1:], col + 1
    return [r.rstrip() for r in rows if r.strip()]


def test_on_a_terminal_a_live_bar_log_records_above_it_and_the_short_summary(job, tmp_path):
    code, written = on_a_terminal(job + ["--output", str(tmp_path / "out")])
    assert code == 4, written[-3000:]
    assert SANDBOX_KEY not in written
    draws = [d for d in written.split("\r") if " docs, " in d]
    assert len(draws) >= 2 and "\x1b[" not in written, written[-3000:]   # redrawn in place, one line
    shown = screen(written)
    bars = [line for line in shown if " docs, " in line]
    assert len(bars) == 1 and BAR.match(bars[0]), shown   # the bar's final state, whole
    the_summary_drawn(bars[0], summary(tmp_path / "out"), total=len(corpus_rows(n_short=60, n_long=1)))
    assert int(BAR.match(bars[0])["percent"]) < 100     # the budget stopped it: requests were left unsent
    logged = [line for line in shown if LOG_LINE.match(line)]
    assert any(RETRY_WARNING.match(line) for line in logged), shown   # written above the bar, whole
    assert all(" docs, " not in line for line in logged)
    after = shown[shown.index(bars[0]) + 1:]
    assert after[0].startswith("run ") and after[0].endswith("stopped, the budget ran out (exit 4)"), after
    labels = [line.split()[0] for line in after[1:]]
    assert labels == ["read", "this", "view", "money", "files", "next"], after
    assert "budget_exhausted" in after[2] and "RUB for" in after[4] and "balance −" in after[4]
    assert "the budget ran out" in after[6] and "--resume" in after[6]
    assert not any(" ERROR " in line for line in shown)   # the advice is on the screen once, in the summary
    assert summary(tmp_path / "out")["exit_code"] == 4


def the_summary_drawn(bar: str, figures: dict, total: int) -> None:
    """The bar's last state is summary.json's: documents read, requests, RUB, chunks embedded, tokens."""
    drawn = BAR.match(bar)
    assert drawn, bar
    assert (drawn["documents"], drawn["total"]) == (f"{figures['documents']:,}", f"{total:,}")
    assert drawn["answered"] == f"{figures['requests']:,}" and int(drawn["planned"].replace(",", "")) >= figures["requests"]
    assert drawn["rub"] == rub(figures["cost_rub"]) and drawn["tokens"] == f"{figures['prompt_tokens']:,}"
    assert drawn["chunks"] == f"{figures['embedded']:,}"


def draws(written: str) -> list[re.Match]:
    """Every state of the bar drawn, in order."""
    return [m for m in (BAR.match(d.rstrip()) for d in written.replace("\n", "\r").split("\r")) if m]


@pytest.fixture
def whole_job(tmp_path, sandbox_factory):
    """A run that completes: many requests in flight, every text twice (a text in flight when
    its twin comes is copied after the job: rows the workers never count)."""
    models = write_models(tmp_path / "models.yaml")
    rows = corpus_rows(n_short=80, n_long=2)
    rows += [{"id": f"twin-{r['id']}", "text": r["text"]} for r in rows]
    corpus = write_corpus(tmp_path / "corpus.parquet", rows)
    settings = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    settings["embed"]["progress_redraw_s"] = 0.1
    (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(settings))
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=["--models", str(models), "--latency-ms", "150"])
    argv = [sys.executable, "-m", "pipeline", "run", "--input", str(corpus), "--model", MODEL,
            "--base-url", sb.base_url, "--models-config", str(models), "--output", str(tmp_path / "out"),
            "--run-config", str(tmp_path / "pipeline.yaml"), "--max-in-flight", "4"]
    return argv, len(rows)


def test_the_bar_moves_with_the_requests_and_ends_on_the_summary(whole_job, tmp_path):
    argv, total = whole_job
    code, written = on_a_terminal(argv)
    assert code == 0, written[-3000:]
    states = draws(written)
    figures = summary(tmp_path / "out")
    the_summary_drawn(states[-1].group(0), figures, total)
    assert states[-1]["percent"] == "100"
    # requests answered of those planned, documents read as their requests leave: never all read at 0%
    assert any(0 < int(m["answered"]) < int(m["planned"]) for m in states), [m.group(0) for m in states]
    assert all(m["documents"] != f"{total:,}" for m in states if int(m["planned"]) == 0)
    shares = [int(m["percent"]) for m in states]
    assert any(0 < p < 100 for p in shares), shares
    assert figures["embedded"] > figures["requests"]


@pytest.mark.skipif(shutil.which("script") is None, reason="util-linux's script is not installed")
def test_under_script_from_a_pipe_the_bar_is_drawn(whole_job, tmp_path):
    """`script` gives the command a pseudo-terminal that nobody sized (0 x 0) when it runs from a
    pipe, as in CI: the bar is drawn at 80 columns, cut from the right."""
    argv, total = whole_job
    done = subprocess.run(["script", "-qec", shlex.join(argv), "/dev/null"], cwd=REPO, env=env(),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=DEADLINE_S)
    assert done.returncode == 0, done.stdout[-3000:]
    drawn = [d for d in done.stdout.replace("\n", "\r").split("\r") if " docs, " in d]
    assert drawn and all(len(d.rstrip()) <= 80 for d in drawn), drawn
    assert drawn[-1].startswith("100%|")
    figures = summary(tmp_path / "out")
    assert f" {figures['documents']:,}/{total:,} docs, {figures['requests']:,}/" in drawn[-1]


def test_in_a_pipe_log_lines_no_control_characters_and_json_on_request(job, tmp_path):
    out = tmp_path / "out"
    launched = time.time()
    done = subprocess.run(job + ["--output", str(out), "--json"], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=DEADLINE_S)
    assert done.returncode == 4, done.stderr[-3000:]
    assert json.loads(done.stdout) == summary(out)   # the whole summary, as summary.json has it
    timing = summary(out)["timing"]                  # the first request, from the process start too
    process, started = (dt.datetime.fromisoformat(timing[k]).timestamp() for k in ("process_started_at", "started_at"))
    assert launched - 0.02 <= process <= started     # the kernel counts in 10 ms ticks
    assert timing["seconds_from_process_start_to_first_request"] >= timing["seconds_to_first_request"] > 0
    for stream in (done.stdout, done.stderr):
        assert "\r" not in stream and "\x1b" not in stream and SANDBOX_KEY not in stream
    logged = done.stderr.splitlines()
    assert all(LOG_LINE.match(line) for line in logged), logged
    progress = [line for line in logged if " INFO embedpipe.progress: read " in line]
    assert progress and all(re.search(r"read \d+/\d+ documents, answered \d+/\d+ requests \(\d+%\), .* RUB; ETA", p) for p in progress)
    assert any(RETRY_WARNING.match(line) for line in logged)
    assert not [line for line in logged if " ERROR " in line]   # a budget stop is expected: a warning
    advice = [line for line in logged if "the budget ran out" in line]
    assert len(advice) == 1 and " WARNING embedpipe: " in advice[0] and "--resume" in advice[0]

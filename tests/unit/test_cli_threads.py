"""A thread that ends in an exception under the CLI's logging (pipeline/cli.py): a Beam SDK
harness's thread (a LOOPBACK worker's, whose streams end when Prism dies) is logged for
--verbose only; any other thread's traceback shows as Python prints it."""
from __future__ import annotations

import subprocess
import sys

import pytest

_SCRIPT = """import sys, threading
from pipeline.cli import _logging
_logging(sys.argv[2] == "verbose")
def crash():
    raise RuntimeError("the thread's own failure")
thread = threading.Thread(target=crash, name=sys.argv[1])
thread.start()
thread.join()
"""


def _stderr(thread_name: str, verbose: bool) -> str:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, thread_name, "verbose" if verbose else "quiet"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize("verbose", [False, True])
def test_another_threads_crash_shows_on_every_run(verbose):
    said = _stderr("heartbeat", verbose)
    assert "Exception in thread heartbeat" in said and "RuntimeError: the thread's own failure" in said


@pytest.mark.parametrize("name", ["run_worker_1-1", "read_grpc_client_inputs"])
def test_a_loopback_workers_thread_is_logged_for_verbose_only(name):
    assert "the thread's own failure" not in _stderr(name, verbose=False)
    said = _stderr(name, verbose=True)
    assert f"thread {name} ended" in said and "RuntimeError: the thread's own failure" in said

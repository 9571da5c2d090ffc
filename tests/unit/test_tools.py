"""The tools of the Makefile's targets (tools/) as modules others import: tests/prism's fixtures
and the bench import tools.prism and tools.pool, which leave the importer's logging as it was."""
from __future__ import annotations

import logging
import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["tools.prism", "tools.pool", "tools.worker_boot"])
def test_importing_a_tool_leaves_the_root_loggers_level(module):
    said = subprocess.run([sys.executable, "-c", f"import logging, {module}; print(logging.getLogger().level)"],
                          capture_output=True, text=True, timeout=60)
    assert said.returncode == 0, said.stderr
    assert int(said.stdout) == logging.WARNING   # Python's default

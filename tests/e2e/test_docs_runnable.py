"""Every command block the docs mark runnable (`<!-- runnable -->` before a ```bash block) runs
as written, with bash, against a sandbox, in a directory holding a small corpus; each block in a
fresh directory of its own (tests/docs_markdown.py says what a block may assume)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_KEY
from tests.docs_markdown import runnable_blocks, user_docs
from tests.e2e.helpers import write_corpus
from tests.side_venv import REPO

BLOCKS = [(path, line, block) for path in user_docs() for line, block in runnable_blocks(path)]


@pytest.mark.parametrize("path, line, block", BLOCKS,
                         ids=[f"{p.relative_to(REPO)}:{n}" for p, n, _ in BLOCKS])
def test_runnable_block_runs_as_written(path, line, block, sandbox, reachable_tmp):
    tmp_path = reachable_tmp   # a block may start the embedded PostgreSQL, which runs as another user
    (tmp_path / "corpus").mkdir()
    write_corpus(tmp_path / "corpus" / "docs.parquet")
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY, "BASE_URL": sandbox.base_url,
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (f"{path.relative_to(REPO)}:{line} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}")

"""Every command block the docs mark runnable (`<!-- runnable -->` before a ```bash block) runs
as a reader pastes it: with bash, at a fresh stand-in for the repository's root after `make
setup && . .venv/bin/activate`, with EMBEDDINGS_API_KEY and BASE_URL a sandbox's, and nothing
else made for it (tests/docs_markdown.py)."""
from __future__ import annotations

import pytest

from tests.conftest import SANDBOX_KEY
from tests.docs_markdown import checkout, run_block, runnable_blocks, shell_env, user_docs
from tests.side_venv import REPO

BLOCKS = [(path, line, block) for path in user_docs() for line, block in runnable_blocks(path)]


@pytest.mark.parametrize("path, line, block", BLOCKS,
                         ids=[f"{p.relative_to(REPO)}:{n}" for p, n, _ in BLOCKS])
def test_runnable_block_runs_as_written(path, line, block, sandbox, reachable_tmp):
    # reachable: a block may start the embedded PostgreSQL, which runs as another user; a
    # checkout's path may hold a space, which a block must quote
    (reachable_tmp / "a checkout").mkdir()
    root = checkout(reachable_tmp / "a checkout")
    done = run_block(block, root, shell_env(sandbox.base_url, SANDBOX_KEY), timeout=300)
    assert done.returncode == 0, (f"{path.relative_to(REPO)}:{line} exited {done.returncode}\n"
                                  f"stdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-3000:]}")

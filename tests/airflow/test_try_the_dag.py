"""configs/airflow/README.md's "Try the DAG on your machine", run as written: its runnable blocks
in order, as pasted into one shell at a fresh stand-in for the repository's root
(tests/docs_markdown.py) with a sandbox's two exports: Airflow installed from
requirements-airflow.lock into that root's .venv-airflow, then `airflow dags test` of the three
tasks. What the guide says it prints is checked here."""
from __future__ import annotations

import ast
import re

import pyarrow.parquet as pq
import pytest

from tests.conftest import SANDBOX_KEY
from tests.docs_markdown import checkout, run_block, runnable_blocks, shell_env
from tests.side_venv import REPO

pytestmark = pytest.mark.airflow

GUIDE = REPO / "configs" / "airflow" / "README.md"
BLOCK_TIMEOUT_S = 900   # the install: minutes when uv's cache is cold


def xcoms(printed: str) -> list[dict]:
    """Each task's XCom, in order, as `airflow dags test` logs it."""
    return [ast.literal_eval(found) for found in re.findall(r"Returned value was: (\{.*\})", printed)]


def test_the_guide_s_try_section_runs_as_written(sandbox, reachable_tmp):
    # reachable: the publish starts the embedded PostgreSQL, which runs as another user
    blocks = runnable_blocks(GUIDE)
    assert len(blocks) == 2, "the guide's try section: the install, then the run"
    (reachable_tmp / "a checkout").mkdir()   # a path with a space, which the blocks must quote
    root = checkout(reachable_tmp / "a checkout")
    env = shell_env(sandbox.base_url, SANDBOX_KEY)
    for line, block in blocks:
        done = run_block(block, root, env, timeout=BLOCK_TIMEOUT_S)
        printed = done.stdout + done.stderr
        assert done.returncode == 0, f"{GUIDE.name}:{line} exited {done.returncode}\n{printed[-4000:]}"

    assert re.search(r"DagRun Finished: dag_id=embed_corpus, .*state=success", printed), printed[-4000:]
    assert re.search(r"count\s*-+\s*(\d+)", done.stdout).group(1) == "304"   # psql: the table's rows
    plan, embed, publish = xcoms(printed)
    assert plan["fits"] and plan["changes"]["added"] == embed["changes"]["added"] > 0
    assert embed["outcome"] == "done" and embed["exit_code"] == 0
    assert publish["table"] == "public.embeddings" and publish["action"] == "built"
    assert publish["rows"] == embed["current"]["embedded"] and publish["view"] == embed["current"]["view"]
    files = sorted((root / "out-dag" / "current").glob("embeddings-*.parquet"))
    assert files and {"lang", "source"} <= set(pq.read_schema(files[0]).names)   # keep_columns reached the run
    sent = [h for charge in sandbox.ledger() for h in charge["input_sha256"]]
    assert sent and len(sent) == len(set(sent))
    assert SANDBOX_KEY not in printed
    for log in (root / "airflow-home" / "logs").rglob("*"):
        assert not log.is_file() or SANDBOX_KEY not in log.read_text(errors="replace"), log

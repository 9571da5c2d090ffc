"""docs/library.md's examples, run as written (each fenced python block whose first line is
`# example: NAME`) in a fresh interpreter against the sandbox, and what they leave checked."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SANDBOX_KEY
from tests.library.helpers import micro
from tests.side_venv import REPO

EXAMPLE = re.compile(r"^```python\n# example: (\w+)\n(.*?)^```", re.S | re.M)


def examples() -> dict[str, str]:
    return dict(EXAMPLE.findall((REPO / "docs" / "library.md").read_text(encoding="utf-8")))


def test_the_guide_has_the_four_examples():
    assert set(examples()) == {"embed_texts", "daily_store", "mltransform", "rag_qdrant"}


def _run(name: str, sandbox, cwd: Path) -> str:
    env = {**os.environ, "BASE_URL": sandbox.base_url, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    done = subprocess.run([sys.executable, "-c", examples()[name]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def _lines(cwd: Path, prefix: str) -> list[dict]:
    return [json.loads(line) for f in sorted(cwd.glob(f"out/{prefix}*.jsonl")) for line in f.read_text().splitlines()]


def test_embed_texts_example(sandbox, tmp_path):
    _run("embed_texts", sandbox, tmp_path)
    vectors, failed = _lines(tmp_path, "vectors"), _lines(tmp_path, "failed")
    assert sorted(v["id"] for v in vectors) == ["a", "b", "d"] and all(len(v["vector"]) == 1536 for v in vectors)
    assert [(f["doc_id"], f["reason"]) for f in failed] == [("c", "empty_text")]
    ledger = sandbox.ledger()
    assert sum(len(c["input_sha256"]) for c in ledger) == 2   # a and d share one text
    assert sum(micro(v["cost_rub"]) for v in vectors) == sum(micro(c["cost_rub"]) for c in ledger)


def test_daily_store_example_pays_day_2_for_the_changed_text_only(sandbox, tmp_path):
    _run("daily_store", sandbox, tmp_path)
    day1, day2 = _lines(tmp_path, "day-1"), _lines(tmp_path, "day-2")
    ledger = sandbox.ledger()
    assert len(day1) == len(day2) == 40 and len(ledger) == 2   # one request a day
    assert len(ledger[1]["input_sha256"]) == 1                # day 2: faq-0's new text alone
    paid_day2 = [r for r in day2 if r["cost_rub"] > 0]
    assert [r["id"] for r in paid_day2] == ["faq-0"] and paid_day2[0]["request"] == ledger[1]["request_id"]
    assert {r["request"] for r in day2 if r["id"] != "faq-0"} == {ledger[0]["request_id"]}
    assert list((tmp_path / "paid-texts" / "_compacted").glob("*.parquet"))


def test_mltransform_example_and_its_artifacts(sandbox, tmp_path):
    _run("mltransform", sandbox, tmp_path)
    assert _lines(tmp_path, "questions") == [{"dimensions": 1536}] * 2
    assert _lines(tmp_path, "served") == [{"dimensions": 1536}]
    files = [f for f in (tmp_path / "artifacts").rglob("*") if f.is_file()]
    assert files and not any(SANDBOX_KEY.encode() in f.read_bytes() for f in files)


def test_rag_qdrant_example(sandbox, tmp_path):
    pytest.importorskip("qdrant_client", reason="the rag extra (installed by make test)")
    nearest = _run("rag_qdrant", sandbox, tmp_path).strip().splitlines()[-1]
    first, second = eval(nearest)   # a printed list of tuples
    assert first[0] == 1 and first[1] > 0 and first[2] > 0 and second[0] != 1
    charges = sandbox.ledger()
    assert sum(micro(c["cost_rub"]) for c in charges[:-1]) > 0   # the pipeline's; the last is the query's

"""The recipes of docs/outputs.md ("Reading the vectors"), run exactly as written.

A recipe is a fenced python block in docs/outputs.md whose first line is `# recipe: NAME`. It runs
in a given interpreter, with the working directory holding `corpus/` (the input) and `out/`
(a real run's output), and leaves two results behind: `neighbours` (doc_id, chunk_index,
similarity, text) and `cost_per_row` (id, chunks, cost_rub), as a DuckDB relation, a Polars
or Arrow table or a list of tuples: DRIVER turns them into JSON rows to compare.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import re
import subprocess
from pathlib import Path
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipeline.cli import main
from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY
from tests.side_venv import REPO

MODEL = "text-embedding-3-small"   # the recipes cast to its 1536 dimensions
QUERY = ("lambda", 0)              # the chunk whose neighbours the recipes find
RECIPE = re.compile(r"^```python\n# recipe: (\w+)\n(.*?)^```", re.S | re.M)

DRIVER = r"""
import json, sys
namespace = {"__name__": "__main__"}
exec(compile(sys.stdin.read(), "docs/outputs.md recipe", "exec"), namespace)

def rows(result):
    for convert in ("fetchall", "rows"):          # DuckDB relation, Polars DataFrame
        if hasattr(result, convert):
            return [list(r) for r in getattr(result, convert)()]
    if hasattr(result, "to_pylist"):               # Arrow table
        return [list(r.values()) for r in result.to_pylist()]
    return [list(r) for r in result]

print(json.dumps({name: rows(namespace[name]) for name in ("neighbours", "cost_per_row")}))
"""


RECIPES = REPO / "docs" / "outputs.md"


def recipes() -> dict[str, str]:
    return dict(RECIPE.findall(RECIPES.read_text(encoding="utf-8")))


def topics() -> list[dict]:
    """The language reference topics shipped with Python, one row per distinct text (equal
    texts would have equal vectors, and engines may order such ties differently)."""
    from pydoc_data.topics import topics
    rows, seen = [], set()
    for name, text in sorted(topics.items()):
        if text not in seen:
            seen.add(text)
            rows.append({"id": name, "text": text})
    return rows


def write_corpus(workdir: Path, rows: list[dict]) -> Path:
    (workdir / "corpus").mkdir(parents=True, exist_ok=True)
    path = workdir / "corpus" / "topics.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def a_day_earlier(rows: list[dict]) -> list[dict]:
    """The corpus as it was the day before: every tenth topic had another text, and there
    were topics that have gone since."""
    earlier = [{**r, "text": r["text"] + "\n(draft)"} if i % 10 == 5 else r for i, r in enumerate(rows)]
    return earlier + [{"id": f"gone-{i}", "text": r["text"] + "\n(gone)"} for i, r in enumerate(rows[:20])]


@contextlib.contextmanager
def embedded_topics(workdir: Path) -> Iterator[Path]:
    """WORKDIR with corpus/ and out/: the topics embedded by real runs against a sandbox, on
    two days: out/current/ must be exactly today's corpus."""
    with SandboxProcess(workdir / "sandbox.db", key=SANDBOX_KEY, balance=1000.0) as sandbox, \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        for rows in (a_day_earlier(topics()), topics()):
            write_corpus(workdir, rows)
            assert main(["run", "--input", str(workdir / "corpus" / "*.parquet"), "--output", str(workdir / "out"),
                         "--model", MODEL, "--base-url", sandbox.base_url, "--sync"]) == 0
    yield workdir


def run_recipe(python: str | Path, name: str, workdir: Path) -> dict[str, list]:
    done = subprocess.run([str(python), "-c", DRIVER], input=recipes()[name], cwd=workdir,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"recipe {name} failed:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def expected(workdir: Path) -> dict[str, list]:
    """The answers, computed from the files row by row in plain Python."""
    files = sorted((workdir / "out" / "current").glob("embeddings-*.parquet"))
    emb = [r for f in files for r in pq.read_table(f).to_pylist()]
    texts = {r["id"]: r["text"] for r in pq.read_table(workdir / "corpus").to_pylist()}
    # the view the recipes read is today's corpus: one row per chunk, no other version
    keys = [(r["doc_id"], r["chunk_index"], r["token_start"]) for r in emb]
    assert len(keys) == len(set(keys)) and {r["doc_id"] for r in emb} == set(texts)
    single = {r["doc_id"]: r["text_sha256"] for r in emb if r["chunk_count"] == 1}
    assert all(sha == hashlib.sha256(texts[d].encode()).hexdigest() for d, sha in single.items())
    query = next(r["embedding"] for r in emb if (r["doc_id"], r["chunk_index"]) == QUERY)

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b, strict=True)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    scored = sorted(((cosine(r["embedding"], query), r["doc_id"], r["chunk_index"]) for r in emb
                     if r["doc_id"] != QUERY[0]), reverse=True)[:5]
    neighbours = [[doc_id, index, score, texts[doc_id][:40]] for score, doc_id, index in scored]
    costs: dict[str, list] = {}
    for r in emb:
        chunks, micro = costs.get(r["doc_id"], (0, 0))
        costs[r["doc_id"]] = (chunks + 1, micro + round(r["cost_rub"] * 1e6))
    cost_per_row = sorted(([doc_id, chunks, micro / 1e6] for doc_id, (chunks, micro) in costs.items()),
                          key=lambda r: (-r[2], r[0]))
    return {"neighbours": neighbours, "cost_per_row": cost_per_row}


def assert_same_answer(got: dict[str, list], want: dict[str, list], name: str) -> None:
    assert [r[:2] for r in got["neighbours"]] == [r[:2] for r in want["neighbours"]], name
    assert [r[3] for r in got["neighbours"]] == [r[3] for r in want["neighbours"]], name
    for g, w in zip(got["neighbours"], want["neighbours"], strict=True):
        assert math.isclose(g[2], w[2], abs_tol=1e-5), (name, g, w)
    assert [(r[0], r[1], round(r[2], 6)) for r in got["cost_per_row"]] == \
        [(r[0], r[1], round(r[2], 6)) for r in want["cost_per_row"]], name

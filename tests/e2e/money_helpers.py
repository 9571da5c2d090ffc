"""Shared by the money tests (budget, resume, reconcile, plan, report): a corpus that makes many
small requests, a model catalogue that the pipeline and the sandbox both use (small requests,
short vectors, a round price), and readers of the current output files and of the ledger."""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipeline.cli import main
from service.catalog import load_models
from service.sandbox.store import read_ledger
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, WORDS_RU, assert_passages, current_files, paragraph

REPO = Path(__file__).resolve().parents[2]
MODEL = "text-embedding-3-small"
PRICE_PER_1M = 100.0          # RUB: a token costs 100 micro-roubles, a request a few kopecks
MAX_INPUTS = 4                # many requests from a small corpus
MAX_INPUT_TOKENS = 512        # long documents split into a few chunks
MAX_REQUEST_TOKENS = 1024     # so the largest request costs at most 0.1024 RUB
DIMS = 32                     # small vectors: the outputs stay tiny


def write_models(path: Path, price_per_1m: float = PRICE_PER_1M) -> Path:
    """A copy of configs/models.yaml with MODEL shrunk as above (the other models unchanged)."""
    doc = {"models": {name: {k: v for k, v in dataclasses.asdict(m).items() if k != "name"}
                      for name, m in load_models().items()}}
    doc["models"][MODEL].update(max_input_tokens=MAX_INPUT_TOKENS, max_inputs_per_request=MAX_INPUTS,
                                max_tokens_per_request=MAX_REQUEST_TOKENS, dimensions=DIMS,
                                price_rub_per_1m_tokens=price_per_1m)
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return path


def corpus_rows(n_short: int = 300, n_long: int = 6, seed: int = 3, prefix: str = "") -> list[dict]:
    """Short documents (one chunk each), long ones (several chunks), two ids sharing one text,
    and one empty text (a failed row)."""
    rng = random.Random(seed)
    rows = [{"id": f"{prefix}s-{i}", "text": paragraph(rng, WORDS_EN + WORDS_RU, rng.randint(8, 40))}
            for i in range(n_short)]
    rows += [{"id": f"{prefix}l-{i}", "text": "\n\n".join(paragraph(rng, WORDS_EN, 120) for _ in range(12))}
             for i in range(n_long)]
    rows.append({"id": f"{prefix}shared", "text": rows[0]["text"]})
    rows.append({"id": f"{prefix}empty", "text": ""})
    return rows


def write_corpus(path: Path, rows: list[dict]) -> Path:
    schema = pa.schema([("id", pa.string()), ("text", pa.string())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def start_sandbox(factory, models: Path, *, balance: float = 100.0, args=(), **kwargs):
    return factory(key=SANDBOX_KEY, balance=balance, args=["--models", str(models), *args], **kwargs)


def run(corpus: Path, out: Path, sandbox, models: Path, *extra: str) -> int:
    return main(["run", "--input", str(corpus), "--output", str(out), "--model", MODEL,
                 "--base-url", sandbox.base_url, "--models-config", str(models), *extra])


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def current(out: Path, kind: str) -> pa.Table:
    """The rows of KIND in the files summary.json lists as DIR's current view (a view holds no
    file without rows: none of KIND reads as an empty table)."""
    files = current_files(out, kind)
    return pa.concat_tables([pq.read_table(f) for f in files], promote_options="default") if files else pa.table({})


def ledger(sandbox) -> list[dict]:
    return list(read_ledger(sandbox.db))


def micro(values) -> int:
    return sum(round(v * 1e6) for v in values if v is not None)


def billed_twice(charges: list[dict]) -> dict[str, int]:
    counts = collections.Counter(h for c in charges for h in c["input_sha256"])
    return {h: n for h, n in counts.items() if n > 1}


def assert_every_row_once(out: Path, rows: list[dict]) -> dict[str, int]:
    """Every chunk of every input row is in exactly one of the current embeddings, failed and
    pending files, and every document's chunks are complete. Returns rows per kind."""
    seen: dict[tuple, str] = {}
    counts: dict[str, tuple] = {}
    per_kind = {}
    for kind in ("embeddings", "failed", "pending"):
        table = current(out, kind)
        per_kind[kind] = table.num_rows
        if not table.num_rows:
            continue
        cols = {c: table.column(c).to_pylist() if c in table.column_names else [None] * table.num_rows
                for c in ("doc_id", "chunk_index", "chunk_count", "token_start")}
        for doc_id, index, count, start in zip(*cols.values(), strict=True):
            key = (doc_id, index, start)
            assert key not in seen, f"{key} is in both {seen[key]} and {kind}"
            seen[key] = kind
            if index is not None:
                counts.setdefault(doc_id, count)
    by_doc = collections.defaultdict(set)
    for doc_id, index, _ in seen:
        by_doc[doc_id].add(index)
    assert set(by_doc) == {r["id"] for r in rows}
    for doc_id, indexes in by_doc.items():
        expected = {None} if doc_id not in counts else set(range(counts[doc_id]))
        assert indexes == expected, f"{doc_id}: chunks {sorted(indexes, key=str)}, expected {expected}"
    assert_passages(out, {r["id"]: r["text"] for r in rows})
    return per_kind


def job_argv(corpus: Path, out: Path, sandbox, models: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "pipeline", "run", "--input", str(corpus), "--output", str(out),
            "--model", MODEL, "--base-url", sandbox.base_url, "--models-config", str(models), *extra]


def start_job(corpus: Path, out: Path, sandbox, models: Path, log: Path, *extra: str) -> subprocess.Popen:
    """`python -m pipeline run` as a real process in its own session (killable with its group)."""
    env = {**os.environ, "EMBEDDINGS_API_KEY": SANDBOX_KEY}
    with open(log, "wb") as fh:
        return subprocess.Popen(job_argv(corpus, out, sandbox, models, "--max-in-flight", "1", *extra),
                                cwd=REPO, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def kill_once_journaled(corpus: Path, out: Path, sandbox, models: Path, log: Path, n: int, *extra: str) -> None:
    """Run the job on CORPUS and SIGKILL it (its whole process group) once N answers are
    journaled, then stop SANDBOX: the service bills a request it was working on even when the
    client is gone; stopping it within its latency keeps that request out."""
    proc = start_job(corpus, out, sandbox, models, log, *extra)
    try:
        wait_for_journal(proc, out, n, log)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    sandbox.kill()


def journal_files(out: Path) -> list[Path]:
    return sorted(out.glob("_journal/*/*.parquet"))


def wait_for_journal(proc: subprocess.Popen, out: Path, n: int, log: Path, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while len(journal_files(out)) < n:
        assert proc.poll() is None, f"the job ended ({proc.returncode}) before the kill:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "the job journaled nothing in time"
        time.sleep(0.005)


def balances(money: str) -> bool:
    """The short summary's money line balances as printed: `balance −D = rows R + part P − part Q
    ... RUB`, each figure as shown (to the micro-rouble), nothing else in the equation."""
    found = re.fullmatch(r"balance ([−+])([\d,.]+) = (.+?) RUB.*", money.split(" · ")[1])
    assert found, money
    fell = Decimal(found[2].replace(",", "")) * (1 if found[1] == "−" else -1)
    terms = re.findall(r"(?:^|([+−]) )([a-z]+) ([\d,.]+)", found[3])
    assert " ".join(f"{sign} {name} {value}".strip() for sign, name, value in terms) == found[3], money
    return fell == sum(Decimal(value.replace(",", "")) * (-1 if sign == "−" else 1) for sign, _, value in terms)

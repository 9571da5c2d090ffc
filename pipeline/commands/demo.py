"""`make run`: the whole job offline. Sandbox on a free loopback port, a real corpus (the
Python language reference that ships with Python), plan, run, the summary, and the passages
nearest to the one about the "for" statement, found with the vectors written."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.parquet as pq

from pipeline.corpora.python_docs import write_python_docs_corpus
from service.sandbox.launcher import SandboxProcess

DEMO_KEY = "sk-demo-not-a-secret"
MODEL = "text-embedding-3-small"
QUERY_ID = "for:0"   # the sandbox's vectors are lexical: passages that share its words come first


def nearest(output_dir: Path, corpus: Path, doc_id: str, k: int = 5) -> list[tuple[float, str, str]]:
    """The K passages whose vectors are closest (cosine) to DOC_ID's first chunk, other than
    itself: (score, id, the passage's first line)."""
    table = pq.read_table(sorted((output_dir / "current").glob("embeddings-*.parquet")),
                          columns=["doc_id", "chunk_index", "embedding"])
    matrix = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    ids, chunks = table.column("doc_id").to_pylist(), table.column("chunk_index").to_pylist()
    scores = matrix @ matrix[ids.index(doc_id)]  # the vectors are unit length
    heading = {i: (t or "").split("\n", 1)[0] for i, t in
               zip(*pq.read_table(corpus, columns=["id", "text"]).to_pydict().values())}
    best = [i for i in np.argsort(-scores) if ids[i] != doc_id and chunks[i] == 0][:k]
    return [(float(scores[i]), ids[i], heading[ids[i]]) for i in best]


def main(argv: list[str], cmd_plan: Callable[[list[str]], int], cmd_run: Callable[[list[str]], int]) -> int:
    """The CLI's own plan and run commands are passed in (the CLI imports this module)."""
    ap = argparse.ArgumentParser(prog="embedpipe demo")
    ap.add_argument("--workdir", default="demo")
    args = ap.parse_args(argv)
    work = Path(args.workdir).resolve()
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.parquet"
    counts = write_python_docs_corpus(str(corpus))
    print(f"corpus: {corpus}, the Python language reference (pydoc_data.topics) {counts}")
    db = work / "sandbox.db"
    db.unlink(missing_ok=True)
    with SandboxProcess(db, key=DEMO_KEY, balance=100.0) as sandbox:
        print(f"sandbox: {sandbox.base_url} (demo key, balance 100 RUB)")
        os.environ["EMBEDDINGS_API_KEY"] = DEMO_KEY
        common = ["--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url]
        print("\n== plan ==")
        cmd_plan(common)
        print("\n== run ==")
        code = cmd_run(common + ["--output", str(out), "--keep-columns", "topic"])
        summary = json.loads((out / "summary.json").read_text())
        print(f"\nsummary: {out / 'summary.json'}")
        print(json.dumps({k: summary[k] for k in ("reconciliation", "balance_before", "balance_after")}, indent=2))
    print(f"\n== passages nearest to {QUERY_ID} ==")
    for score, doc_id, heading in nearest(out, corpus, QUERY_ID):
        print(f"  {score:.3f}  {doc_id:<16}  {heading}")
    return code

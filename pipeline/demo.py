"""`make run`: the whole job offline. Sandbox on a free loopback port, a sample corpus, plan,
run, the summary, and a nearest-neighbour query over the vectors written."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from pipeline.sample_corpus import write_sample_corpus
from service.client import EmbeddingsClient
from service.credentials import ApiKey
from service.sandbox.launcher import SandboxProcess

DEMO_KEY = "sk-demo-not-a-secret"
MODEL = "text-embedding-3-small"
QUERY = "how to write a parquet file with python"


def nearest(output_dir: Path, corpus: Path, vector: np.ndarray, k: int = 5) -> list[tuple[float, str, int, str]]:
    table = pq.read_table(sorted(output_dir.glob("embeddings-*.parquet")),
                          columns=["doc_id", "chunk_index", "embedding"])
    matrix = table.column("embedding").combine_chunks().flatten().to_numpy().reshape(table.num_rows, -1)
    scores = matrix @ vector
    texts = dict(zip(*pq.read_table(corpus, columns=["id", "text"]).to_pydict().values()))
    best = np.argsort(-scores)[:k]
    ids, chunks = table.column("doc_id").to_pylist(), table.column("chunk_index").to_pylist()
    return [(float(scores[i]), ids[i], chunks[i], (texts.get(ids[i]) or "")[:70].replace("\n", " "))
            for i in best]


def main(argv: list[str]) -> int:
    from pipeline.cli import cmd_plan, cmd_run
    ap = argparse.ArgumentParser(prog="embedpipe demo")
    ap.add_argument("--workdir", default="demo")
    ap.add_argument("--docs", type=int, default=300)
    args = ap.parse_args(argv)
    work = Path(args.workdir).resolve()
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    work.mkdir(parents=True, exist_ok=True)
    corpus = work / "corpus.parquet"
    counts = write_sample_corpus(str(corpus), n_docs=args.docs, seed=7)
    print(f"sample corpus: {corpus} {counts}")
    db = work / "sandbox.db"
    db.unlink(missing_ok=True)
    with SandboxProcess(db, key=DEMO_KEY, balance=100.0) as sandbox:
        print(f"sandbox: {sandbox.base_url} (demo key, balance 100 RUB)")
        os.environ["EMBEDDINGS_API_KEY"] = DEMO_KEY
        common = ["--input", str(corpus), "--model", MODEL, "--base-url", sandbox.base_url]
        print("\n== plan ==")
        cmd_plan(common)
        print("\n== run ==")
        code = cmd_run(common + ["--output", str(out), "--keep-columns", "lang,source"])
        summary = json.loads((out / "summary.json").read_text())
        print(f"\nsummary: {out / 'summary.json'}")
        print(json.dumps({k: summary[k] for k in ("reconciliation", "balance_before", "balance_after")}, indent=2))
        with EmbeddingsClient(sandbox.base_url, ApiKey(DEMO_KEY)) as client:
            query = client.embed(MODEL, [QUERY]).vectors[0]
        print(f"\n== nearest neighbours of {QUERY!r} ==")
        for score, doc_id, chunk, snippet in nearest(out, corpus, query):
            print(f"  {score:.3f}  {doc_id} #{chunk}  {snippet}")
    return code

"""`python -m pipeline compare DIR`: during a switch, the two models on the user's own corpus,
from the two views and with nothing paid.

For a sample of chunks that both views hold (the same text, so the same sha256), the k nearest
neighbours of each among a pool of such chunks, by cosine, under the served model and under the
target: their overlap (shared neighbours / k) says how much a search would change. A model
that keeps most neighbours is a safe swap; a low overlap is worth a look at the queries that
matter before the switch completes. Beside it, what the switch cost so far and what is left.
"""
from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipeline.exits import EXIT_OK, UsageError
from pipeline.outdir import OutputDir
from pipeline.outdir import switch as switches
from pipeline.outdir.jsonfiles import read_json
from pipeline.outdir.view import View
from pipeline.settings.config import default_settings_text, parse_settings
from pipeline.settings.options import command_args
from pipeline.terminal.figures import count
from transforms.read.parquet import open_parquet, read_tables


def _hashes(out: OutputDir, view: View) -> pa.Array:
    tables = read_tables([out.join(p) for p in view.paths("embeddings")], ["text_sha256"])
    if not tables:
        return pa.array([], pa.string())
    return pc.unique(pa.chunked_array([t.column(0) for t in tables], pa.string()))


def _vectors(out: OutputDir, view: View, wanted: pa.Array) -> np.ndarray:
    """The unit vectors of WANTED's texts, in WANTED's order, a batch of rows at a time."""
    found: dict[str, np.ndarray] = {}
    for path in view.paths("embeddings"):
        with open_parquet(out.join(path)) as fh:
            for batch in pq.ParquetFile(fh).iter_batches(columns=["text_sha256", "embedding"]):
                keep = pc.is_in(batch.column(0), value_set=wanted)
                if not pc.any(keep).as_py():
                    continue
                rows = batch.filter(keep)
                flat = rows.column(1).flatten().to_numpy(zero_copy_only=False).astype(np.float32)
                for sha, vector in zip(rows.column(0).to_pylist(), flat.reshape(rows.num_rows, -1), strict=True):
                    found.setdefault(sha, vector)
    matrix = np.stack([found[sha] for sha in wanted.to_pylist()])
    return np.asarray(matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12))


def neighbours(unit: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Row indexes of the K most similar rows of UNIT to each query row (itself left out)."""
    scores = unit[queries] @ unit.T
    scores[np.arange(len(queries)), queries] = -np.inf
    return np.argpartition(-scores, k, axis=1)[:, :k]


def overlaps(a: np.ndarray, b: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    """Per query, the share of its K nearest neighbours under A that are among them under B."""
    na, nb = neighbours(a, queries, k), neighbours(b, queries, k)
    return np.array([len(set(x) & set(y)) / k for x, y in zip(na, nb, strict=True)])


def compare(out: OutputDir, sample: int, k: int, pool: int, seed: int) -> dict[str, Any]:
    record, served, target = switches.load(out), out.view, out.target().view
    if record is None or served is None or target is None:
        raise UsageError(f"{out.path} has no switch under way with a view to compare: start one with `python -m "
                         "pipeline run ... --sync --switch-model --model OTHER`")
    theirs = _hashes(out, target)
    shared = theirs.filter(pc.is_in(theirs, value_set=_hashes(out, served)))
    rng = np.random.default_rng(seed)
    chosen = pa.array(sorted(rng.choice(shared.to_pylist(), size=min(pool, len(shared)), replace=False)
                             if len(shared) else []), pa.string())
    last = read_json(out.join("summary.json")) or {}
    report = {"from": served.model, "to": target.model, "chunks_in_both": len(shared), "pool": len(chosen),
              "k": k, "sample": 0, "overlap": None, "histogram": None,
              "spent_rub": switches.spent_rub(out, record),
              "estimated_rub_to_finish": (last.get("switch") or {}).get("estimated_rub_to_finish")}
    if len(chosen) <= k:
        report["note"] = (f"{count(len(chosen), 'chunk')} in both views: more than k={k} are needed to compare "
                          "neighbours")
        return report
    a, b = _vectors(out, served, chosen), _vectors(out, target, chosen)
    queries = rng.choice(len(chosen), size=min(sample, len(chosen)), replace=False)
    found = overlaps(a, b, queries, k)
    report.update(sample=len(queries),
                  histogram={f"{i}/{k}": int(np.sum(np.isclose(found, i / k))) for i in range(k + 1)},
                  overlap={"mean": round(float(found.mean()), 4),
                           **{f"p{q}": round(float(np.percentile(found, q)), 4) for q in (10, 50, 90)}})
    return report


def render(r: dict[str, Any]) -> str:
    lines = [f"{r['from']} -> {r['to']}: {count(r['chunks_in_both'], 'chunk')} in both views; switch spent "
             f"{r['spent_rub']:.6f} RUB so far, ~{r['estimated_rub_to_finish'] or 0:.6f} RUB to finish (last run)"]
    if r["overlap"] is None:
        return "\n".join(lines + [r["note"]])
    o = r["overlap"]
    lines.append(f"{r['k']} nearest neighbours of {r['sample']} chunks among {r['pool']:,}: shared under both "
                 f"models {o['mean']:.0%} on average (p10 {o['p10']:.0%}, median {o['p50']:.0%}, p90 {o['p90']:.0%})")
    width = max(r["histogram"].values()) or 1
    lines += [f"  {share:>6}  {'#' * round(40 * n / width):<40} {n}" for share, n in r["histogram"].items()]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    defaults = parse_settings(default_settings_text()).compare
    parser = argparse.ArgumentParser(prog="python -m pipeline compare",
                                     description="a switch's two models on DIR's corpus: shared nearest neighbours")
    parser.add_argument("dir", help="the --output directory of a switch under way (local, gs://, s3://)")
    parser.add_argument("--sample", type=int, default=defaults.sample,
                        help=f"chunks compared (default {defaults.sample})")
    parser.add_argument("--k", type=int, default=defaults.k, help=f"neighbours per chunk (default {defaults.k})")
    parser.add_argument("--pool", type=int, default=defaults.pool,
                        help=f"chunks searched for neighbours (default {defaults.pool})")
    parser.add_argument("--seed", type=int, default=defaults.seed, help="which chunks are drawn")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = command_args(parser, argv)
    if isinstance(args, int):
        return args
    if min(args.sample, args.k, args.pool) < 1:
        raise UsageError("--sample, --k and --pool must be at least 1")
    report = compare(OutputDir(args.dir), args.sample, args.k, args.pool, args.seed)
    print(json.dumps(report, indent=2) if args.json else render(report))
    return EXIT_OK

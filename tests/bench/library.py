"""The library section of `make bench` (--only-library runs it alone).

1. The CLI job and `embedpipe.EmbedTexts` (a user's pipeline: ReadFromParquet -> EmbedTexts ->
   Parquet files of its own) on the same corpus and sandbox (50 ms + 5 us per token), one
   after the other, each a child process, --library-repeats times in turns: wall, CPU, peak
   RSS, requests, and how long after its first row EmbedTexts's first request left.
   Target: the library within 1.1x of the CLI in wall and client CPU.
2. EmbedTexts with a store of paid texts: a first run, the same run again (target: 0
   requests), and a run on the corpus with 2.5% of its documents changed (requests and RUB
   in proportion to the change).
3. MLTransform with `embedpipe.ServiceTextEmbeddings` against Beam's `OpenAITextEmbeddings`
   (the bench extra: openai) on the same texts (the corpus's documents that fit the model's
   input limit, --library-texts of them) and sandbox: requests and wall of each.

The children are this module: `python -m tests.bench.library embed-texts|mltransform ...`.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from service.sandbox.store import read_ledger
from service.tokenizer import get_encoding
from tests.bench.report import table

MODEL = "text-embedding-3-small"


# -- the children ---------------------------------------------------------------------------

def _write_rows(rows: list[dict], out_dir: str) -> int:
    """The user's own sink: one Parquet file per batch of rows."""
    table_ = pa.table({"doc_id": [r["doc_id"] for r in rows], "chunk_index": [r["chunk_index"] for r in rows],
                       "cost_rub": [r["cost_rub"] for r in rows],
                       "embedding": pa.FixedSizeListArray.from_arrays(
                           pa.array(np.stack([r["embedding"] for r in rows]).reshape(-1)), len(rows[0]["embedding"]))})
    # as the CLI writes (configs/pipeline.yaml write:, transforms/write/transform.py open_writer) and
    # docs/library.md advises: float32 vectors uncompressed, with no dictionary or statistics; the rest zstd
    codecs = {name: "none" if name == "embedding" else "zstd" for name in table_.column_names}
    scalars = [name for name in table_.column_names if name != "embedding"]
    pq.write_table(table_, os.path.join(out_dir, f"part-{uuid.uuid4().hex}.parquet"), compression=codecs,
                   use_dictionary=scalars, write_statistics=scalars)
    return len(rows)


_first_seen: list[float] = []


def _first_row(row: dict, path: str) -> dict:
    """The user's rows pass through: when the first one came is written down."""
    if not _first_seen:
        _first_seen.append(time.time())
        with open(path, "w") as fh:
            json.dump(_first_seen[0], fh)
    return row


def _count(values, path: str) -> None:
    with open(path, "w") as fh:
        json.dump(sum(values), fh)


def embed_texts(a) -> None:
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    import embedpipe
    from pipeline.runner import make_runner
    os.makedirs(a.output, exist_ok=True)
    opts = PipelineOptions([])
    with beam.Pipeline(runner=make_runner(opts), options=opts) as p:
        result = (p | beam.io.ReadFromParquet(a.input, columns=["id", "text"])
                  | beam.Map(_first_row, os.path.join(a.output, "first_row.json"))
                  | embedpipe.EmbedTexts(MODEL, a.base_url, store=a.store))
        (result.embeddings | beam.BatchElements(min_batch_size=1000, max_batch_size=1000)
         | beam.Map(_write_rows, a.output) | beam.combiners.ToList()
         | beam.Map(_count, os.path.join(a.output, "rows.json")))
        (result.failed, result.pending) | beam.Flatten() | "Unfinished" >> beam.combiners.Count.Globally() \
            | beam.Map(lambda n, path: _count([n], path), os.path.join(a.output, "unfinished.json"))


def mltransform(a) -> None:
    import apache_beam as beam
    from apache_beam.ml.transforms.base import MLTransform
    from apache_beam.options.pipeline_options import PipelineOptions

    from pipeline.runner import make_runner
    if a.provider == "embedpipe":
        import embedpipe
        provider = embedpipe.ServiceTextEmbeddings(["text"], MODEL, a.base_url)
    else:
        from apache_beam.ml.transforms.embeddings.open_ai import OpenAITextEmbeddings
        os.environ["OPENAI_BASE_URL"] = a.base_url
        provider = OpenAITextEmbeddings(MODEL, ["text"], api_key=os.environ["EMBEDDINGS_API_KEY"])
    rows = pq.read_table(a.input).to_pylist()
    artifacts = tempfile.mkdtemp(prefix="bench-mlt-")
    opts = PipelineOptions([])
    with beam.Pipeline(runner=make_runner(opts), options=opts) as p:
        (p | beam.Create(rows) | MLTransform(write_artifact_location=artifacts).with_transform(provider)
         | beam.Map(lambda row: 1 if row["text"] is not None else 0) | beam.combiners.ToList()
         | beam.Map(_count, a.result))
    shutil.rmtree(artifacts, ignore_errors=True)


# -- the section ----------------------------------------------------------------------------

def _fitting_texts(corpus: Path, n: int, max_tokens: int, path: Path) -> int:
    """N of the corpus's texts that fit the model's input (Beam's provider cannot split one) into
    PATH; their tokens."""
    texts = pq.read_table(corpus, columns=["text"]).column(0).to_pylist()
    counts = get_encoding().encode_ordinary_batch(texts)
    chosen = [(t, len(c)) for t, c in zip(texts, counts, strict=True) if len(c) <= max_tokens][:n]
    pq.write_table(pa.table({"text": [t for t, _ in chosen]}), path)
    return sum(k for _, k in chosen)


def _at(charge: dict) -> float:
    import datetime as dt
    return dt.datetime.fromisoformat(charge["created_at"].replace("Z", "+00:00")).timestamp()


def _first_sent(charges: list[dict]) -> float:
    """When the first request left: the ledger has when it was billed, after the sandbox's
    latency (LATENCY: 50 ms + 5 us per token) for it."""
    first = min(charges, key=_at)
    return _at(first) - (0.050 + 5e-6 * first["total_tokens"])


def _charges(db: str, started: float, wall_s: float) -> list[dict]:
    return [r for r in read_ledger(db) if started <= _at(r) <= started + wall_s + 1]


def _changed_corpus(corpus: Path, fraction: float, path: Path) -> int:
    """CORPUS with every (1/FRACTION)th document's text changed, into PATH; how many changed."""
    table_ = pq.read_table(corpus)
    texts = table_.column("text").to_pylist()
    every = round(1 / fraction)
    texts = [t + " (revised)" if i % every == 0 and t else t for i, t in enumerate(texts)]
    pq.write_table(table_.set_column(table_.schema.get_field_index("text"), "text", pa.array(texts, pa.string())),
                   path)
    return sum(1 for i, t in enumerate(texts) if i % every == 0 and t)


def _embed_texts(bench, name: str, corpus: Path, sb, out: Path, store: Path | None = None):
    """(measured child, its charges, rows, rows failed or pending, first row's time) of one EmbedTexts pipeline."""
    shutil.rmtree(out, ignore_errors=True)
    started = time.time()
    argv = ["-m", "tests.bench.library", "embed-texts", "--input", str(corpus), "--base-url", sb.base_url,
            "--output", str(out)] + (["--store", str(store)] if store else [])
    m = bench.measured(name, argv, sb)
    charges = _charges(sb.db, started, m.wall_s)
    rows = json.loads((out / "rows.json").read_text())
    unfinished = json.loads((out / "unfinished.json").read_text())
    first = json.loads((out / "first_row.json").read_text())
    shutil.rmtree(out, ignore_errors=True)
    return m, charges, rows, unfinished, first


def _store_runs(bench, corpus: Path, out: Path) -> None:
    from tests.bench.run_bench import LATENCY
    store, changed_corpus = bench.work / "library-store", bench.work / "library-changed.parquet"
    shutil.rmtree(store, ignore_errors=True)
    changed = _changed_corpus(corpus, 0.025, changed_corpus)
    rows_, figures = [], []
    with bench.sandbox("library-store", LATENCY) as sb:
        for label, source in (("first run", corpus), ("the same run again", corpus),
                              (f"{changed:,} documents changed (2.5%)", changed_corpus)):
            m, charges, rows, _, _ = _embed_texts(bench, f"library-store-{len(rows_) + 1}", source, sb, out, store)
            rub = sum(c["cost_rub"] for c in charges)
            rows_.append([label, m.wall_s, m.cpu_s, len(charges), round(rub, 6), rows])
            figures.append((len(charges), rub))
    shutil.rmtree(store, ignore_errors=True)
    bench.emit(table(["EmbedTexts with store=", "wall s", "client CPU s", "requests", "RUB", "rows"], rows_,
                     f"Library: a store of paid texts, {bench.args.docs:,} documents, run after run"))
    (r1, rub1), (r2, _), (r3, rub3) = figures
    bench.targets.append(f"EmbedTexts with a store: the same run again {r2} requests (target 0); 2.5% of documents "
                         f"changed: {r3} requests ({r3 / max(r1, 1):.1%} of the first run's), {rub3:.6f} RUB "
                         f"({rub3 / max(rub1, 1e-9):.1%})")


def run(bench, corpus: Path) -> None:
    from tests.bench.run_bench import LATENCY
    a, work = bench.args, bench.work
    out = work / "out-library"
    rows_, walls, cpus, delays = [], [], [], []
    for i in range(1, a.library_repeats + 1):   # in turns: the machine is shared and its speed drifts
        with bench.sandbox("library", LATENCY) as sb:
            cli, summary, _ = bench.pipeline(f"library-cli-{i}", corpus, sb, None, 1)
            lib, charges, rows, unfinished, first = _embed_texts(bench, f"library-embed-texts-{i}", corpus, sb, out)
            lib_requests = len(charges)
            delays.append(_first_sent(charges) - first)
        rows_ += [[f"{i}: CLI job (python -m pipeline run)", cli.wall_s, cli.cpu_s, cli.peak_rss_mb,
                   summary["requests"], summary["embedded"], summary["failed"] + summary["pending"]],
                  [f"{i}: EmbedTexts (ReadFromParquet -> EmbedTexts -> Parquet)", lib.wall_s, lib.cpu_s,
                   lib.peak_rss_mb, lib_requests, rows, unfinished]]
        walls.append(lib.wall_s / cli.wall_s)
        cpus.append(lib.cpu_s / cli.cpu_s)
    bench.emit(table(["run", "wall s", "client CPU s", "peak RSS MB", "requests", "rows", "failed+pending"], rows_,
                     f"Library: EmbedTexts against the CLI job, {a.docs:,} documents, sandbox 50 ms + 5 us per token"))
    bench.targets.append(f"EmbedTexts / CLI job at {a.docs:,} documents, {len(walls)} pairs: wall "
                         f"{', '.join(f'{r:.2f}' for r in walls)}x, client CPU {', '.join(f'{r:.2f}' for r in cpus)}x"
                         f"; target <= 1.1x; first request sent {', '.join(f'{d:.2f}' for d in delays)} s "
                         f"after the first row (billed a sandbox latency later)")
    _store_runs(bench, corpus, out)
    texts = work / "library-texts.parquet"
    tokens = _fitting_texts(corpus, a.library_texts, bench.model.max_input_tokens, texts)
    rows_, providers = [], ["embedpipe"]
    if importlib.util.find_spec("openai"):
        providers.append("openai")
    else:
        bench.say("  Beam's OpenAITextEmbeddings needs openai: pip install -e '.[bench]' (skipped)")
    for provider in providers:
        with bench.sandbox(f"library-{provider}", LATENCY) as sb:
            result = work / f"library-{provider}.json"
            started = time.time()
            m = bench.measured(f"library-mlt-{provider}", ["-m", "tests.bench.library", "mltransform", "--provider",
                                                           provider, "--input", str(texts), "--base-url",
                                                           sb.base_url, "--result", str(result)], sb)
            charges = _charges(sb.db, started, m.wall_s)
            rows_.append([{"embedpipe": "ServiceTextEmbeddings", "openai": "Beam's OpenAITextEmbeddings"}[provider],
                          len(charges), m.wall_s, m.cpu_s, json.loads(result.read_text()),
                          sum(c["prompt_tokens"] for c in charges)])
    bench.emit(table(["MLTransform provider", "requests", "wall s", "CPU s", "texts embedded", "tokens billed"],
                     rows_, f"Library: MLTransform on the same {a.library_texts:,} texts ({tokens:,} tokens), "
                            "sandbox 50 ms + 5 us per token"))
    if len(rows_) < 2:
        return
    (_, req_e, wall_e, *_), (_, req_o, wall_o, *_) = rows_
    bench.targets.append(f"MLTransform, ServiceTextEmbeddings / OpenAITextEmbeddings: {req_e} / {req_o} requests, "
                         f"wall {wall_e:.1f} / {wall_o:.1f} s")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.library")
    sub = ap.add_subparsers(dest="what", required=True)
    e = sub.add_parser("embed-texts")
    e.add_argument("--input", required=True)
    e.add_argument("--base-url", required=True)
    e.add_argument("--output", required=True)
    e.add_argument("--store")
    m = sub.add_parser("mltransform")
    m.add_argument("--provider", choices=("embedpipe", "openai"), required=True)
    m.add_argument("--input", required=True)
    m.add_argument("--base-url", required=True)
    m.add_argument("--result", required=True)
    a = ap.parse_args(argv)
    (embed_texts if a.what == "embed-texts" else mltransform)(a)


if __name__ == "__main__":
    main(sys.argv[1:])

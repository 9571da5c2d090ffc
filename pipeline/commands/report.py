"""`python -m pipeline report DIR`: what DIR's embeddings cost, per model, and a picture of it.

Reads DIR's current view (pipeline/outdir): every request DIR's runs made, and the chunks DIR
serves now, through Beam's FileSystems so that gs:// and s3:// work like local paths.
The table needs nothing beyond the project; DIR/report.png needs matplotlib, an optional
extra (`pip install 'embedpipe[report]'`), imported only when drawing.
"""
from __future__ import annotations

import argparse
import io
import logging

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline.exits import EXIT_OK, UsageError
from pipeline.outdir import OutputDir
from pipeline.settings.options import unknown_flags, use_filesystems
from transforms.money.apportion import from_micro, to_micro
from transforms.read.parquet import read_tables

log = logging.getLogger("embedpipe")

REQUEST_COLUMNS = ["model", "total_tokens", "cost_rub", "attempts", "started_at"]
HEADER = ("model", "requests", "tokens", "RUB", "RUB per 1M tokens", "retries")


def current_files(output_dir: str, kind: str) -> list[str]:
    out = OutputDir(output_dir)
    if out.view is None:
        raise UsageError(f"{output_dir} has no current view (no run finished there): is it a run's --output?")
    return [out.join(path) for path in out.view.paths(kind)]


def load(paths: list[str], columns: list[str]) -> pa.Table | None:
    tables = read_tables(paths, columns)
    # files written before the columns were declared required are nullable: unify, do not refuse
    return pa.concat_tables(tables, promote_options="default") if tables else None


def cost_table(requests: pa.Table | None) -> list[dict]:
    """One row per model, sorted by name: requests, tokens, RUB (summed to the micro-rouble),
    average RUB per 1M tokens, retries (attempts beyond the first)."""
    rows = []
    if requests is None:
        return rows
    for model in sorted(set(requests.column("model").to_pylist())):
        t = requests.filter(pc.equal(requests.column("model"), model))
        micro = sum(to_micro(v) for v in t.column("cost_rub").to_pylist() if v is not None)
        tokens = pc.sum(t.column("total_tokens")).as_py() or 0
        retries = sum(max(0, (a or 1) - 1) for a in t.column("attempts").to_pylist())
        rows.append({"model": model, "requests": t.num_rows, "tokens": tokens, "cost_rub": from_micro(micro),
                     "rub_per_1m_tokens": round(micro / tokens, 6) if tokens else None, "retries": retries})
    return rows


def render(rows: list[dict]) -> str:
    if not rows:
        return "no embeddings requests in this directory's current files"
    cells = [HEADER] + [(r["model"], str(r["requests"]), str(r["tokens"]), f"{r['cost_rub']:.6f}",
                         "-" if r["rub_per_1m_tokens"] is None else f"{r['rub_per_1m_tokens']:.6f}",
                         str(r["retries"])) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in cells)


def draw(requests: pa.Table | None, n_tokens: list[int]) -> bytes:
    """PNG: cumulative cost and tokens over the requests' start times; chunk length histogram."""
    from matplotlib.figure import Figure  # optional extra; no pyplot, so no GUI backend or global state

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    spend, hist = fig.subplots(1, 2)
    if requests is not None and requests.num_rows:
        t = requests.sort_by("started_at")
        when = t.column("started_at").to_pylist()
        cost = spend.step(when, pc.cumulative_sum(pc.fill_null(t.column("cost_rub"), 0.0)).to_pylist(),
                          where="post", color="tab:red", label="RUB")
        tokens = spend.twinx()
        used = tokens.step(when, pc.cumulative_sum(pc.fill_null(t.column("total_tokens"), 0)).to_pylist(),
                           where="post", color="tab:blue", linestyle="--", label="tokens")
        tokens.set_ylabel("tokens", color="tab:blue")
        spend.legend(handles=cost + used, loc="upper left")
        fig.autofmt_xdate()
    spend.set(title="spending over time", xlabel="request started (UTC)")
    spend.set_ylabel("RUB", color="tab:red")
    hist.hist(n_tokens, bins=min(50, max(1, len(set(n_tokens)))), color="tab:gray")
    hist.set(title="chunk length", xlabel="tokens per chunk", ylabel="chunks")
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline report",
                                     description="cost per model of a run directory, and DIR/report.png")
    parser.add_argument("dir", help="a run's --output directory (local, gs://, s3://)")
    parser.epilog = "Beam's filesystem options pass through (--s3_endpoint_url, --project, ...)."
    try:
        args, beam_flags = parser.parse_known_args(argv)
    except SystemExit as exc:  # argparse printed the usage
        return int(exc.code or 0)
    if unknown := unknown_flags(beam_flags):
        raise UsageError(f"unknown option(s): {', '.join(unknown)}")
    use_filesystems(PipelineOptions(beam_flags))
    requests = load(current_files(args.dir, "requests"), REQUEST_COLUMNS)
    print(render(cost_table(requests)))
    try:
        import matplotlib  # noqa: F401  (only to know whether the picture can be drawn)
    except ImportError:
        print("report.png not written: matplotlib is not installed (pip install 'embedpipe[report]')")
        return EXIT_OK
    chunks = load(current_files(args.dir, "embeddings"), ["n_tokens"])
    png = FileSystems.join(args.dir, "report.png")
    with FileSystems.create(png) as fh:
        fh.write(draw(requests, [] if chunks is None else chunks.column("n_tokens").to_pylist()))
    print(f"wrote {png}")
    return EXIT_OK

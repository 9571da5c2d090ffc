"""`python -m pipeline report DIR`: what DIR's embeddings cost, per model, and a picture of it.

Reads DIR's current view (pipeline/outdir): every request DIR's runs made, and every paid
`search`'s query (its own request, in DIR's history: a search since the last run is not in the
view yet), through Beam's FileSystems so that gs:// and s3:// work like local paths. The
searches are counted in their model's row, and apart in its last column.
The table needs nothing beyond the project; DIR/report.png needs matplotlib, an optional
extra (`pip install 'embedpipe[report]'`), imported only when drawing.
"""
from __future__ import annotations

import argparse
import datetime as dt
import io
import logging
from collections.abc import Collection
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.exits import EXIT_OK, UsageError
from pipeline.outdir import OutputDir, records
from pipeline.settings.options import command_args
from transforms.money.apportion import from_micro, to_micro
from transforms.read.parquet import read_tables

log = logging.getLogger("embedpipe")

REQUEST_COLUMNS = ["model", "total_tokens", "cost_rub", "attempts", "started_at", "latency_ms", "run_id"]
HEADER = ("model", "requests", "tokens", "RUB", "RUB per 1M tokens", "retries", "searches")


def current_files(output_dir: str, kind: str) -> list[str]:
    out = OutputDir(output_dir)
    if out.view is None:
        raise UsageError(f"{output_dir} has no current view (no run finished there): is it a run's --output?")
    return [out.join(path) for path in out.view.paths(kind)]


def search_ids(output_dir: str) -> set[str]:
    """The ids of the searches that paid for a query in DIR (their records' mode)."""
    return {r["run_id"] for r in records.read_records(output_dir) if r.get("mode") == records.SEARCH}


def request_files(output_dir: str, searches: set[str]) -> list[str]:
    """The view's requests files, and those of the SEARCHES the view does not list yet."""
    out = OutputDir(output_dir)
    listed = current_files(output_dir, "requests")
    relative = {out.relative(p) for p in listed}
    return listed + [p for run_id in sorted(searches) for p in out.history_files("requests", run_id)
                     if out.relative(p) not in relative]


def load(paths: list[str], columns: list[str]) -> pa.Table | None:
    tables = read_tables(paths, columns)
    # files written before the columns were declared required are nullable: unify, do not refuse
    return pa.concat_tables(tables, promote_options="default") if tables else None


def cost_table(requests: pa.Table | None, searches: Collection[str] = ()) -> list[dict[str, Any]]:
    """One row per model, sorted by name: requests, tokens, RUB (summed to the micro-rouble),
    average RUB per 1M tokens, retries (attempts beyond the first), and how many of the
    requests were SEARCHES' (by run id)."""
    rows: list[dict[str, Any]] = []
    if requests is None:
        return rows
    for model in sorted(set(requests.column("model").to_pylist())):
        t = requests.filter(pc.equal(requests.column("model"), model))
        micro = sum(to_micro(v) for v in t.column("cost_rub").to_pylist() if v is not None)
        tokens = pc.sum(t.column("total_tokens")).as_py() or 0
        retries = sum(max(0, (a or 1) - 1) for a in t.column("attempts").to_pylist())
        rows.append({"model": model, "requests": t.num_rows, "tokens": tokens, "cost_rub": from_micro(micro),
                     "rub_per_1m_tokens": round(micro / tokens, 6) if tokens else None, "retries": retries,
                     "searches": sum(run_id in searches for run_id in t.column("run_id").to_pylist())})
    return rows


def render(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no embeddings requests in this directory's current files"
    cells = [HEADER] + [(r["model"], str(r["requests"]), str(r["tokens"]), f"{r['cost_rub']:.6f}",
                         "-" if r["rub_per_1m_tokens"] is None else f"{r['rub_per_1m_tokens']:.6f}",
                         str(r["retries"]), str(r["searches"])) for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
                     for row in cells)


def can_draw() -> bool:
    try:
        import matplotlib  # noqa: F401  (only to know whether the picture can be drawn)
    except ImportError:
        return False
    return True


def draw(requests: pa.Table | None) -> bytes:
    buf = io.BytesIO()
    figure(requests).savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def figure(requests: pa.Table | None) -> Any:   # a matplotlib Figure (the optional report extra)
    """Each model's cumulative RUB over the requests' start times, from 0; beside it, each
    request's latency over the same times (retried ones marked x). Times in UTC, as the requests
    files hold them."""
    from matplotlib.figure import Figure  # optional extra; not pyplot: no GUI backend, no global state

    fig = Figure(figsize=(11, 4.5), layout="constrained")
    spend, latency = fig.subplots(1, 2, sharex=True)
    spend.set(title="spending over time", ylabel="RUB (cumulative)")
    latency.set(title="latency of each request", ylabel="ms")
    if requests is None or not requests.num_rows:
        spend.text(0.5, 0.5, "no requests", ha="center", transform=spend.transAxes)
    else:
        _plot(spend, latency, requests.sort_by("started_at"))
    return fig


def _plot(spend: Any, latency: Any, t: pa.Table) -> None:
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter

    starts = t.column("started_at").to_pylist()
    last = max(w + dt.timedelta(milliseconds=ms) for w, ms in zip(starts, t.column("latency_ms").to_pylist(), strict=True))
    for model in sorted(set(t.column("model").to_pylist())):
        rows = t.filter(pc.equal(t.column("model"), model))
        when = rows.column("started_at").to_pylist()
        rub = pc.cumulative_sum(pc.fill_null(rows.column("cost_rub"), 0.0)).to_pylist()
        line, = spend.step([when[0], *when, last], [0.0, *rub, rub[-1]], where="post", label=model)
        retried = pc.greater(rows.column("attempts"), 1)
        for points, marker, label in ((pc.invert(retried), "o", model), (retried, "x", f"{model}, retried")):
            mine = rows.filter(points)
            if mine.num_rows:   # a retried request's latency includes its backoff
                latency.scatter(mine.column("started_at").to_pylist(), mine.column("latency_ms").to_pylist(),
                                s=12, marker=marker, color=line.get_color(), label=label)
    # from the first request to the last answer; a run of one request still gets a second or so
    pad = max((last - starts[0]) * 0.03, dt.timedelta(seconds=0.5))
    for ax in (spend, latency):
        locator = AutoDateLocator()
        ax.xaxis.set_major_locator(locator)
        ax.xaxis.set_major_formatter(ConciseDateFormatter(locator))
        ax.set(xlabel="request started (UTC)", xlim=(starts[0] - pad, last + pad), ylim=(0, None))
        ax.legend(loc="best")


def write_picture(output_dir: str, requests: pa.Table | None) -> str:
    png = FileSystems.join(output_dir, "report.png")
    with FileSystems.create(png) as fh:
        fh.write(draw(requests))
    return png


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m pipeline report",
                                     description="cost per model of a run directory, and DIR/report.png")
    parser.add_argument("dir", help="a run's --output directory (local, gs://, s3://)")
    args = command_args(parser, argv)
    if isinstance(args, int):
        return args
    searches = search_ids(args.dir)
    requests = load(request_files(args.dir, searches), REQUEST_COLUMNS)
    print(render(cost_table(requests, searches)))
    if can_draw():
        print(f"wrote {write_picture(args.dir, requests)}")
    else:
        print("report.png not written: matplotlib is not installed (make dev; pip install 'embedpipe[report]' elsewhere)")
    return EXIT_OK

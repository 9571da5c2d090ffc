"""`report`'s picture, drawn from a requests table: spending per model from 0 over a readable
time axis, and every request's latency beside it. Needs the optional matplotlib (the `report`
extra); skipped without it."""
from __future__ import annotations

import datetime as dt
import io

import pyarrow as pa
import pytest

pytest.importorskip("matplotlib")
from matplotlib.dates import ConciseDateFormatter, num2date

from pipeline.commands import report

T0 = dt.datetime(2026, 11, 24, 9, 0, tzinfo=dt.UTC)
# (model, seconds after T0, RUB, latency ms, attempts)
REQUESTS = [("small", 0, 0.10, 30.0, 1), ("large", 5, 0.40, 45.0, 1), ("small", 20, 0.25, 520.0, 2),
            ("small", 95, 0.05, 35.0, 1), ("large", 100, 0.20, 60.0, 1)]


def requests() -> pa.Table:
    model, seconds, rub, latency, attempts = zip(*REQUESTS, strict=True)
    return pa.table({"model": model, "total_tokens": [1000] * len(REQUESTS), "cost_rub": rub,
                     "attempts": pa.array(attempts, pa.int32()), "latency_ms": latency,
                     "started_at": pa.array([T0 + dt.timedelta(seconds=s) for s in seconds],
                                            pa.timestamp("us", tz="UTC"))})


def test_one_line_per_model_climbs_from_zero_to_what_the_model_cost():
    spend, _ = report.figure(requests()).axes
    lines = {line.get_label(): list(line.get_ydata()) for line in spend.get_lines()}
    assert set(lines) == {"small", "large"}
    for model, heights in lines.items():
        total = sum(r[2] for r in REQUESTS if r[0] == model)
        assert heights[0] == 0 and heights[-1] == pytest.approx(total) and heights == sorted(heights)
    assert spend.get_ylim()[0] == 0


def test_the_time_axis_spans_the_requests_and_reads_at_a_glance():
    fig = report.figure(requests())
    spend, latency = fig.axes
    fig.savefig(io.BytesIO(), format="png")   # tick labels exist once drawn
    start, end = (num2date(x) for x in spend.get_xlim())
    assert start < T0 and end > T0 + dt.timedelta(seconds=100, milliseconds=60)   # to the last answer
    for ax in (spend, latency):
        assert isinstance(ax.xaxis.get_major_formatter(), ConciseDateFormatter)
    labels = [t.get_text() for t in spend.get_xticklabels() if t.get_text()]
    assert labels and all(len(label) <= 5 for label in labels), labels   # "09:01", not a full timestamp each
    assert "2026" in spend.xaxis.get_offset_text().get_text()


def test_every_request_has_its_latency_and_retried_ones_are_told_apart():
    _, latency = report.figure(requests()).axes
    points = {c.get_label(): sorted(y for _, y in c.get_offsets()) for c in latency.collections}
    assert points == {"small": [30.0, 35.0], "small, retried": [520.0], "large": [45.0, 60.0]}
    assert latency.get_ylim()[0] == 0


def test_a_directory_without_requests_still_gets_a_picture():
    assert report.draw(None)[:8] == report.draw(requests().slice(0, 0))[:8] == b"\x89PNG\r\n\x1a\n"

"""The driver's view of the job while it runs: the sum of what every worker reported
(transforms/worker/progress.py), drawn as a live bar when stderr is a terminal, or logged as
one line every `embed.progress_interval_s` where it is not (Airflow, CI, a pipe).

On a terminal the workers write their counts every `embed.progress_redraw_s` and the driver
reads them as often. Where requests are planned as documents are read (PACED: the local
runner), the bar's share is that of the requests answered (documents read, times requests
answered of those planned); elsewhere the line counts, with no share or ETA (the total is not
known until the last request is packed: transforms/worker/progress.py). Its last state is drawn
from the files the job wrote, the figures of summary.json (the workers' counts leave out rows
copied after the job).
A terminal that reports no size (a pseudo-terminal nobody sized: `script` run from a pipe,
some CI runners) is drawn at the width of $COLUMNS, else 80: tqdm would draw nothing there.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from typing import IO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from pipeline.settings.config import EmbedSettings
from pipeline.terminal.figures import count, rub
from transforms.worker import progress
from transforms.worker.progress import Counts

log = logging.getLogger("embedpipe.progress")

# The share done and the time first, then the money, then the rest: a narrow terminal cuts from the right.
BAR = "{percentage:3.0f}%|{bar}| {docs} docs, {requests} [{elapsed}<{remaining}, {speed}] {money} | {work}"
COUNTS = "{docs} docs, {requests} [{elapsed}, {speed}] {money} | {work}"   # not PACED: no share to draw


def _shape(fp: IO) -> tuple[int, int]:
    """tqdm's (columns - 1, lines - 1) of FP's terminal, with shutil's fallback where it reports 0."""
    try:
        columns, lines = os.get_terminal_size(fp.fileno())
    except (OSError, ValueError, AttributeError):
        columns = lines = 0
    fallback = shutil.get_terminal_size()
    return (columns or fallback.columns) - 1, (lines or fallback.lines) - 1


class _Tqdm(tqdm):
    """tqdm with fields of its own in the format; n is the share done (total 1)."""
    monitor_interval = 0   # no monitor thread: the driver's poll redraws the bar

    def __init__(self, *args, fields: dict[str, str], **kwargs):
        self.fields = fields   # before tqdm's first draw
        columns, lines = _shape(kwargs.get("file") or sys.stderr)
        super().__init__(*args, ncols=columns, nrows=lines, **kwargs)
        self.dynamic_ncols = _shape   # follows a resized terminal

    @property
    def format_dict(self):
        return {**super().format_dict, **self.fields}


class Bar(contextlib.AbstractContextManager):
    """The live bar. While it is up, log records of the job are written above it (tqdm.write),
    never through it; when it closes it stays on screen with the final counts."""

    def __init__(self, total_documents: int, spendable_rub: float, paced: bool):
        self._total, self._spendable, self._started = total_documents, spendable_rub, time.monotonic()
        self._paced = paced
        self._bar = _Tqdm(total=1.0 if paced else None, file=sys.stderr, smoothing=0,
                          bar_format=BAR if paced else COUNTS, fields=self._fields(Counts(), final=False))
        self._logs = logging_redirect_tqdm(tqdm_class=_Tqdm)

    def __enter__(self):
        self._logs.__enter__()
        return self

    def _fields(self, counts: Counts, final: bool) -> dict[str, str]:
        elapsed = time.monotonic() - self._started
        tokens = f"{counts.tokens:,}" if final else _short(counts.tokens)
        return {"docs": f"{counts.documents:,}/{self._total:,}" if self._total else f"{counts.documents:,}",
                "requests": (f"{counts.answered:,}/{count(counts.planned, 'request')}" if self._paced
                             else f"{count(counts.answered, 'request')} answered"),
                "speed": f"{counts.answered / elapsed:,.0f} req/s" if counts.answered and elapsed else "? req/s",
                "money": f"{rub(counts.cost_micro / 1e6)}/{rub(self._spendable)} RUB",
                "work": f"{counts.chunks:,} chunks, {tokens} tokens"}

    def show(self, counts: Counts, final: bool = False) -> None:
        self._bar.fields = self._fields(counts, final)
        if self._paced:
            self._bar.n = progress.done(counts, self._total)
        self._bar.refresh()

    def close(self, final: Counts) -> None:
        self.show(final, final=True)

    def __exit__(self, *exc):
        self._bar.close()
        self._logs.__exit__(*exc)


def _short(n: int) -> str:
    """98.2k, 123M: a figure that moves on a live bar."""
    return f"{n:,}" if n < 1000 else tqdm.format_sizeof(n)


class Lines(contextlib.AbstractContextManager):
    """The log line of a pipe: logged when the counts changed since the last one."""

    def __init__(self, total_documents: int, paced: bool):
        self._total, self._paced, self._started, self._last = total_documents, paced, time.monotonic(), Counts()

    def show(self, counts: Counts) -> None:
        if counts != self._last:
            log.info(progress.line(counts, self._total, time.monotonic() - self._started, self._paced))
            self._last = counts

    def close(self, final: Counts) -> None:
        """The last line, summary.json's figures, when lines were logged: a log that shows
        progress ends on the true figures; a run shorter than one interval logs none."""
        if self._last != Counts():
            self.show(final)

    def __exit__(self, *exc):
        pass


def on_terminal() -> bool:
    return sys.stderr.isatty()


def report_interval_s(embed: EmbedSettings) -> float:
    """How often each worker writes its counts: as often as the bar is redrawn on a terminal,
    as often as the line is logged elsewhere."""
    return min(embed.progress_redraw_s, embed.progress_interval_s) if on_terminal() else embed.progress_interval_s


class Ending:
    """What the job ended with, set by the caller once it knows (summary.json's figures);
    the workers' last counts otherwise (the job failed)."""

    def __init__(self, read: Callable[[], Counts]) -> None:
        self.counts: Counts | None = None
        self.read = read   # the workers' counts

    def __call__(self, documents: int, figures: dict) -> None:
        """The last state from the job's DOCUMENTS (its counter) and the FIGURES of
        pipeline/commands/summary.run_figures; planned as the workers last reported."""
        requests = figures["requests"]
        self.counts = Counts(documents=documents, planned=max(self.read().planned, requests),
                             answered=requests, chunks=figures["embedded"], tokens=figures["prompt_tokens"],
                             requests=requests, cost_micro=round(figures["cost_rub"] * 1e6))


@contextlib.contextmanager
def job_progress(output_dir: str, run_id: str, total_documents: int, spendable_rub: float, embed: EmbedSettings,
                 paced: bool):
    """While the body runs: a bar on a terminal, else a log line every `progress_interval_s`.
    PACED: requests are planned as documents are read. Yields an Ending: call it with the job's
    figures for the last state."""
    ending = Ending(functools.partial(progress.read_counts, output_dir, run_id))
    tick = report_interval_s(embed)
    stop = threading.Event()
    with Bar(total_documents, spendable_rub, paced) if on_terminal() else Lines(total_documents, paced) as view:
        def poll():
            while not stop.wait(tick):
                view.show(ending.read())

        thread = threading.Thread(target=poll, name="progress", daemon=True)
        thread.start()
        try:
            yield ending
        finally:
            stop.set()
            thread.join()
            view.close(ending.counts or ending.read())

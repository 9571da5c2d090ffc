"""The driver's view of the job while it runs: the sum of what every worker reported
(transforms/worker/progress.py), drawn as a live bar when stderr is a terminal, or logged as
one line every `embed.progress_interval_s` where it is not (Airflow, CI, a pipe)."""
from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
from collections.abc import Callable

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from pipeline.terminal.figures import count, rub
from transforms.worker import progress
from transforms.worker.progress import Counts

log = logging.getLogger("embedpipe.progress")

# The bar's clock and ETA move this often; its counts change only as often as workers write them.
REDRAW_S = 1.0
# Documents and time first, then the money, then the rest: a narrow terminal cuts from the right.
BAR = "{percentage:3.0f}%|{bar}| {n:,}/{total:,} docs [{elapsed}<{remaining}, {speed}] {money} | {work}"
NO_TOTAL = "{n:,} docs [{elapsed}, {speed}] {money} | {work}"


class _Tqdm(tqdm):
    """tqdm with fields of its own in the format: the money, the work done, documents per second."""
    monitor_interval = 0   # no monitor thread: the driver's poll redraws the bar

    def __init__(self, *args, money: str, work: str, **kwargs):
        self.money, self.work = money, work   # before tqdm's first draw
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self):
        fields = super().format_dict
        speed = f"{fields['n'] / fields['elapsed']:,.0f}/s" if fields["n"] and fields["elapsed"] else "?/s"
        return {**fields, "money": self.money, "work": self.work, "speed": speed}


class Bar(contextlib.AbstractContextManager):
    """The live bar. While it is up, log records of the job are written above it (tqdm.write),
    never through it; when it closes it stays on screen with the final counts."""

    def __init__(self, total_documents: int, spendable_rub: float):
        self._spendable = spendable_rub
        money, work = self._fields(Counts())
        self._bar = _Tqdm(total=total_documents or None, file=sys.stderr, dynamic_ncols=True, smoothing=0,
                          bar_format=BAR if total_documents else NO_TOTAL, money=money, work=work)
        self._logs = logging_redirect_tqdm(tqdm_class=_Tqdm)

    def __enter__(self):
        self._logs.__enter__()
        return self

    def _fields(self, counts: Counts) -> tuple[str, str]:
        """The money, and the work done."""
        return (f"{rub(counts.cost_micro / 1e6)}/{rub(self._spendable)} RUB",
                f"{counts.chunks:,} chunks, {_short(counts.tokens)} tokens, {count(counts.requests, 'request')}")

    def show(self, counts: Counts | None) -> None:
        """New counts, or None: only the clock moved."""
        if counts is not None:
            self._bar.money, self._bar.work = self._fields(counts)
            self._bar.n = counts.documents
        self._bar.refresh()

    def close(self, read: Callable[[], Counts]) -> None:
        self.show(read())

    def __exit__(self, *exc):
        self._bar.close()
        self._logs.__exit__(*exc)


def _short(n: int) -> str:
    """98.2k, 123M: a figure that moves on a live bar."""
    return f"{n:,}" if n < 1000 else tqdm.format_sizeof(n)


class Lines(contextlib.AbstractContextManager):
    """The log line of a pipe: logged when the counts changed since the last one."""

    def __init__(self, total_documents: int):
        self._total, self._started, self._last = total_documents, time.monotonic(), Counts()

    def show(self, counts: Counts | None) -> None:
        if counts is not None and counts != self._last:
            log.info(progress.line(counts, self._total, time.monotonic() - self._started))
            self._last = counts

    def close(self, read: Callable[[], Counts]) -> None:
        pass   # the summary follows

    def __exit__(self, *exc):
        pass


def on_terminal() -> bool:
    return sys.stderr.isatty()


@contextlib.contextmanager
def job_progress(output_dir: str, run_id: str, total_documents: int, spendable_rub: float, interval_s: float):
    """While the body runs: a bar on a terminal, else a log line every INTERVAL_S."""
    read = functools.partial(progress.read_counts, output_dir, run_id)
    bar = on_terminal()
    tick = min(REDRAW_S, interval_s) if bar else interval_s
    reads_every = max(1, round(interval_s / tick))   # ticks: no point reading faster than workers write
    stop = threading.Event()
    with Bar(total_documents, spendable_rub) if bar else Lines(total_documents) as view:
        def poll():
            ticks = 0
            while not stop.wait(tick):
                ticks += 1
                view.show(read() if ticks % reads_every == 0 else None)

        thread = threading.Thread(target=poll, name="progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            view.close(read)

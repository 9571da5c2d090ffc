"""The driver's progress line: while the job runs, sum what every worker reported
(transforms/worker/progress.py) and log one line for the whole job every few seconds."""
from __future__ import annotations

import contextlib
import logging
import threading
import time

from transforms.worker import progress

log = logging.getLogger("embedpipe.progress")


@contextlib.contextmanager
def progress_lines(output_dir: str, run_id: str, total_documents: int, interval_s: float):
    stop, started = threading.Event(), time.monotonic()

    def report():
        last = None
        while not stop.wait(interval_s):
            counts = progress.read_counts(output_dir, run_id)
            if counts != last:
                log.info(progress.line(counts, total_documents, time.monotonic() - started))
                last = counts

    thread = threading.Thread(target=report, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()

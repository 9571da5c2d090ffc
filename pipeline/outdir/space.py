"""A full disk under DIR: one line naming DIR and what to free, never a traceback.

A write into DIR can meet a full disk anywhere: the probe, the lock, the run's start record,
the journal, the job's files, the commit, summary.json. Whatever it was, nothing paid for is
lost (the journal's space is reserved before a request leaves: transforms/money/journal.py)
and the served view is the last committed one, so the next step is always the same: free
space, run the same command again. A worker's error reaches the driver as text (the runner
wraps it), hence the check of the message too; Beam's own log of that worker error is
dropped, the driver's line says it once.
"""
from __future__ import annotations

import errno
import logging
import os

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = tuple(os.strerror(e) for e in NO_SPACE)   # "No space left on device", "Disk quota exceeded"
_MB = 1 << 20


def is_full(exc: BaseException | None) -> bool:
    """Whether EXC, or an error it wraps (Beam's batch file operations, a worker's error as
    text), is a full disk or quota."""
    if exc is None:
        return False
    if isinstance(exc, OSError) and exc.errno in NO_SPACE:
        return True
    details = getattr(exc, "exception_details", None) or {}
    if any(is_full(e) for e in details.values() if isinstance(e, BaseException)):
        return True
    return any(text in str(exc) for text in _TEXTS) or is_full(exc.__cause__)


def _free_mb(path: str) -> str:
    try:
        stat = os.statvfs(path)
    except OSError:
        return ""
    return f", {stat.f_bavail * stat.f_frsize / _MB:.1f} MB free of {stat.f_blocks * stat.f_frsize / _MB:.1f} MB"


def message(output_dir: str, need_bytes: int, again: str) -> str:
    """The line: DIR, what is free, what the run may write (when known), the next step."""
    need = f" (this run writes up to {max(1.0, need_bytes / _MB):.0f} MB)" if need_bytes else ""
    return (f"--output {output_dir}: no space left on its disk{_free_mb(output_dir)}. Free space there{need}, "
            f"then run {again}: every answer already paid for is journaled and is not paid again, and the "
            "served view is the last complete one.")


class _DropFullDisk(logging.Filter):
    """Beam logs a worker's exception with its traceback before the job fails; for a full disk
    the driver's one line replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (is_full(exc) or any(text in record.getMessage() for text in _TEXTS))


def quiet_worker_logs() -> None:
    for name in ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker",
                 "apache_beam.runners.worker.bundle_processor"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropFullDisk) for f in logger.filters):
            logger.addFilter(_DropFullDisk())

"""A full disk under DIR: one line naming DIR, what to free, and how much, never a traceback.

A write into DIR can meet a full disk anywhere: the probe, the lock, the run's start record,
the journal, the job's files, the commit, summary.json. Whatever it was, nothing paid for is
lost (the journal's space is reserved before a request leaves: transforms/money/journal.py)
and the served view is the last committed one, so the next step is always the same: free
space, run the same command again. The figure to free is what that command writes: the
rows of its jobs (the journal, the history) and the files of the view its commit writes
again (a document edited in a file of the view: the whole file, beside the old one until the
commit is done). A failed commit's own files are removed at once (OutputDir.commit): what
the user frees is left for the next try.

A full disk that is not DIR's (the temporary directory, where the local workers' claim file
is) is named instead: by the path the error gives, or, when it gives none and DIR has room
for what the command writes, as the temporary directory. A worker's error reaches the driver
as text (the runner wraps it), hence the check of the message too; Beam's own log of that
worker error is dropped, the driver's line says it once.
"""
from __future__ import annotations

import dataclasses
import errno
import logging
import math
import os
import re
import tempfile
from collections.abc import Iterator

from apache_beam.io.filesystems import FileSystems

NO_SPACE = (errno.ENOSPC, errno.EDQUOT)
_TEXTS = tuple(os.strerror(e) for e in NO_SPACE)   # "No space left on device", "Disk quota exceeded"
_PATH = re.compile("(?:" + "|".join(_TEXTS) + r"): \\?'([^'\\]+)\\?'")   # an OSError with a path, as text
SQLITE_FULL = "database or disk is full"   # SQLite's full disk, without a path: the claim file's (a temporary one)
_MB = 1 << 20
# DIR's small files beside the figures (manifests, records, summary.json, the lock, the view's
# directory of links), each a page at least on a tmpfs: a few hundred KB
MARGIN = _MB


class Full(OSError):
    """A full disk met by a step that knows what it writes in all: NEEDS bytes (the commit)."""

    def __init__(self, needs: int):
        super().__init__(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.needs = needs


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    """EXC and the errors it wraps: its causes, Beam's batch file operations' details."""
    while exc is not None:
        yield exc
        details = getattr(exc, "exception_details", None) or {}
        for inner in details.values():
            if isinstance(inner, BaseException):
                yield from _chain(inner)
        exc = exc.__cause__


def is_full(exc: BaseException | None) -> bool:
    """Whether EXC, or an error it wraps (Beam's batch file operations, a worker's error as
    text), is a full disk or quota."""
    return any((isinstance(e, OSError) and e.errno in NO_SPACE)
               or any(text in str(e) for text in (*_TEXTS, SQLITE_FULL)) for e in _chain(exc))


def full_path(exc: BaseException | None) -> str | None:
    """The path whose write met the full disk, when the error gives one: an OSError's file
    name, the path in a worker's error text; SQLite's full database, the temporary directory."""
    for e in _chain(exc):
        if isinstance(e, OSError) and e.errno in NO_SPACE and e.filename:
            return os.fsdecode(e.filename)
        if found := _PATH.search(str(e)):
            return found.group(1)
        if SQLITE_FULL in str(e):
            return tempfile.gettempdir()
    return None


def other_disk(exc: BaseException, output_dir: str, needs: Needs | None) -> str | None:
    """The full disk's path when it is not DIR's: the one the error gives; without one, the
    temporary directory when DIR is not on a local disk, or has room for what the command
    writes (NEEDS) and the temporary directory is on another disk."""
    path, local = full_path(exc), FileSystems.get_scheme(output_dir) in (None, "file")
    if path is not None:
        return path if not local or not same_disk(path, output_dir) else None
    temp = tempfile.gettempdir()
    room = needs is not None and (free_bytes(output_dir) or 0) >= needs.total
    return temp if not local or (room and not same_disk(temp, output_dir)) else None


def _existing(path: str) -> str:
    """PATH, or its nearest parent that exists (a temporary file is gone once its job failed)."""
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def same_disk(path: str, other: str) -> bool:
    """Whether PATH and OTHER are on one filesystem (so when either is not local)."""
    try:
        return os.stat(_existing(path)).st_dev == os.stat(_existing(other)).st_dev
    except (OSError, ValueError):
        return True


def known_needs(exc: BaseException | None) -> int | None:
    """The bytes a step that met the full disk writes in all (Full), when it said."""
    return next((e.needs for e in _chain(exc) if isinstance(e, Full)), None)


@dataclasses.dataclass(frozen=True)
class Needs:
    """What the same command writes into DIR, in bytes."""
    rows: int          # its jobs' rows: the journal and the history
    rewrites: int      # the files of the view its commit writes again

    @property
    def total(self) -> int:
        return self.rows + self.rewrites + MARGIN


def _mb(n: float) -> int:
    return max(1, math.ceil(n / _MB))


def _disk(path: str | os.PathLike[str]) -> tuple[int, int] | None:
    """(free, size) in bytes of PATH's disk (of its nearest existing parent); None when unknown."""
    try:
        stat = os.statvfs(_existing(os.fspath(path)))
    except (OSError, ValueError):
        return None
    return stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize


def free_bytes(path: str | os.PathLike[str]) -> int | None:
    disk = _disk(path)
    return None if disk is None else disk[0]


def _free_mb(path: str) -> str:
    disk = _disk(path)
    return "" if disk is None else f", {disk[0] / _MB:.1f} MB free of {disk[1] / _MB:.1f} MB"


SERVED = "the served view is the last complete one"


def message(output_dir: str, needs: Needs | None, again: str, served: str = SERVED) -> str:
    """The line: DIR, what is free, what the command writes and what to free (when known),
    the next step. SERVED: what DIR serves meanwhile."""
    free = free_bytes(output_dir)
    if needs is None or free is None:
        what = "Free space there"
    else:
        rewrites = f" and {_mb(needs.rewrites)} MB of the view's files its commit writes again" if needs.rewrites else ""
        what = (f"Free {_mb(needs.total - free)} MB more there (the same command writes up to {_mb(needs.total)} MB: "
                f"its rows{rewrites})")
    return (f"--output {output_dir}: no space left on its disk{_free_mb(output_dir)}. {what}, then run {again}: "
            f"{_kept(served)}")


def _kept(served: str) -> str:
    return f"every answer already paid for is journaled and is not paid again, and {served}."


def elsewhere(path: str, output_dir: str, again: str, served: str = SERVED) -> str:
    """The line for a full disk that is not DIR's: PATH's (the temporary directory's, say)."""
    temp = same_disk(path, tempfile.gettempdir())
    which = f"the temporary directory {tempfile.gettempdir()}" if temp else f"the disk of {path}"
    move = ", or set TMPDIR to a directory on a disk with room" if temp else ""
    return (f"no space left on {which}{_free_mb(path)}, not on --output {output_dir}'s{_free_mb(output_dir)}. "
            f"Free space there{move}, then run {again}: {_kept(served)}")


class _DropFullDisk(logging.Filter):
    """Beam logs a worker's exception with its traceback before the job fails; for a full disk
    the driver's one line replaces it."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (is_full(exc) or any(text in record.getMessage() for text in (*_TEXTS, SQLITE_FULL)))


def quiet_worker_logs() -> None:
    for name in ("apache_beam.runners.common", "apache_beam.runners.worker.sdk_worker",
                 "apache_beam.runners.worker.bundle_processor",
                 "apache_beam.runners.portability.local_job_service"):   # worker processes' errors, as text
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropFullDisk) for f in logger.filters):
            logger.addFilter(_DropFullDisk())

"""The input as the job's workers found it, in one line whatever the runner made of a worker's
error: a file that changed since the scan listed it (its stamp is checked again here), or one
that cannot be read (named by the worker's own message, transforms/read/parquet.py)."""
from __future__ import annotations

from pipeline.checks.inputs import InputInfo
from pipeline.exits import JobFailed, UsageError
from transforms.errors import one_line
from transforms.read import stamps

AGAIN = "run the same command again once the input is written whole"


def changed(info: InputInfo) -> stamps.InputChanged | None:
    return stamps.first_change(info.stamp_map)


def unreadable(exc: Exception) -> str | None:
    """The worker's message when EXC is an input file that cannot be read, else None."""
    last = one_line(exc, worker=True)   # after the error's type, which the runner may prefix
    start = last.find(stamps.INPUT_FILE)
    return last[start:] if start >= 0 and " is not readable Parquet " in last else None


def before_sending(info: InputInfo, exc: Exception) -> Exception:
    """What a job that sends nothing (a count) failing with EXC means for the user: a changed
    input (exit 1), an unreadable one (exit 2), else EXC itself."""
    if (change := changed(info)) is not None:
        return JobFailed(f"{change}; nothing was sent: {AGAIN}.")
    if (reason := unreadable(exc)) is not None:
        return UsageError(f"{reason}; nothing was sent: replace the file with a readable copy.")
    return exc

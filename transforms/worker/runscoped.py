"""Objects shared by every DoFn instance of one worker process for one run.

The streaming steps keep per-run state in memory (claims of sent texts, what earlier runs
delivered or hold): one copy per process, built on first use. The driver discards what it
holds once the job is done (on the local runner in one process, the workers are the driver's
own; worker processes of their own end with the job).
"""
from __future__ import annotations

import threading
from typing import Any, TypeVar, cast
from collections.abc import Callable

T = TypeVar("T")

_lock = threading.RLock()   # a build may ask for another shared object
_by_run: dict[str, dict[str, object]] = {}


def shared(run_id: str, name: str, build: Callable[[], T]) -> T:
    """RUN_ID's object called NAME in this process, built by BUILD the first time."""
    with _lock:
        objects = _by_run.setdefault(run_id, {})
        if name not in objects:
            objects[name] = build()
        return cast(T, objects[name])   # NAME's object: built by a BUILD of the same type


def get(run_id: str, name: str) -> Any:
    """RUN_ID's object called NAME in this process; None if none was built."""
    with _lock:
        return _by_run.get(run_id, {}).get(name)


def discard(run_id: str) -> None:
    """Forget RUN_ID's objects."""
    with _lock:
        _by_run.pop(run_id, None)

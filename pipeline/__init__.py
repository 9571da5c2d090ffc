"""The driver: settings/, checks/, money/, graph.py, outdir/, commands/, terminal/, cli.py.

glibc gives each thread that allocates an arena of its own (up to 8 per core) and keeps what is
freed there: with the Embed threads that was ~1 KB of RSS per document that never came back
(120,000 documents peaked at 619 MB, 526 MB with the limit). The arenas are limited here,
before Beam or any thread starts; MALLOC_ARENA_MAX in the environment wins.

Importing Beam without its GCP extra logs "apitools not found..." on the root logger, a
warning about BigQuery that nobody asked for, and that call also configures the root logger
before the CLI can choose a format. Both entry points (`python -m pipeline`, the `embedpipe`
script) import this package first, so Beam is imported here once with only that line dropped.

That import makes ~1,400 modules' worth of objects that live as long as the process, and the
collector scanned them over and over while they were made: ~300 collections, 0.13-0.17 s of the
time to the first request (measured with gc.callbacks). Collection waits until the import is
done, and what it made is frozen: never scanned again.
"""
import ctypes
import gc
import logging
import os

M_ARENA_MAX = -8  # glibc's mallopt parameter
MALLOC_ARENAS = 2


def _limit_malloc_arenas() -> None:
    if "MALLOC_ARENA_MAX" in os.environ:
        return
    try:
        ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, MALLOC_ARENAS)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass


def _import_beam_quietly() -> None:
    root = logging.getLogger()
    placeholder = logging.NullHandler()  # a handler present: logging.warning() skips basicConfig()

    def drop(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("apitools not found")

    root.addHandler(placeholder)
    root.addFilter(drop)
    collecting = gc.isenabled()
    gc.disable()
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(drop)
        root.removeHandler(placeholder)
        if collecting:
            gc.freeze()
            gc.enable()


_limit_malloc_arenas()
_import_beam_quietly()

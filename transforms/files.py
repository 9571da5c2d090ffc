"""Deleting files on any Beam filesystem, by one rule for every caller that cleans up (a
compaction's merged entries, what stopped runs left in DIR, a failed commit's files, a write's
temporary file). No Beam step here.

- each path on its own: one that cannot be deleted keeps no other;
- a path gone already is not a failure: another cleaner, a compaction, or a write that never
  made it got there first;
- a symbolic link is removed itself, never what it points to (a view's link being placed);
- a local path is never read as a pattern: Beam's FileSystems.delete matches its argument as a
  glob, so a `[`, `*` or `?` in a directory's name would pick other files, or none.
What is left is returned with why: whether that is worth a warning, or a failure, is the
caller's to say.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Iterable

from apache_beam.io.filesystems import FileSystems


def missing(exc: BaseException) -> bool:
    """Whether EXC says a file is not there (each filesystem words it its own way)."""
    text = str(exc).lower()
    return isinstance(exc, FileNotFoundError) or any(w in text for w in ("not found", "no such", "no files found",
                                                                         "404", "does not exist"))


def delete_each(paths: Iterable[str]) -> list[tuple[str, Exception]]:
    """Delete PATHS (files, or local directories with what they hold): those that could not
    be, each with why."""
    left = []
    for path in paths:
        try:
            if FileSystems.get_scheme(path) is None:
                _delete_local(path)
            else:
                FileSystems.delete([path])
        except Exception as exc:
            if not missing(exc):
                left.append((path, exc))
    return left


def remove_empty_dirs(folders: Iterable[str]) -> None:
    """Remove each local folder of FOLDERS that holds nothing (a local disk keeps empty
    directories; object stores have none). One a writer beside us has just put a file in, or
    removed, stays as it is: that is no failure."""
    for folder in folders:
        try:
            os.rmdir(folder)
        except OSError:   # not empty (a writer's file, perhaps just made), gone, or not a local folder
            pass


def _delete_local(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.remove(path)

"""Small files of DIR (manifests, run records, the lock, summary.json, a search's requests):
written whole under a temporary name and renamed, so a reader sees the old file or the new one,
and a writer killed halfway leaves only a temporary name (removed as a leftover)."""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import IO, Any

from apache_beam.io.filesystems import FileSystems

from transforms.files import delete_each

TEMP = ".tmp-"   # PATH.tmp-<uuid>: a file being written, renamed to PATH once whole


def write_whole(path: str, write: Callable[[IO[bytes]], object]) -> None:
    """PATH as WRITE(sink) writes it, under a temporary name until it is whole."""
    temp = f"{path}{TEMP}{uuid.uuid4().hex}"
    try:
        with FileSystems.create(temp) as fh:
            write(fh)
        FileSystems.rename([temp], [path])   # replaces PATH in one step (os.rename; a copy on object stores)
    except BaseException:
        delete_each([temp])   # one left: the failure to report is the write's, the next run removes it
        raise


def write_json(path: str, value: Any, indent: int | None = None) -> None:
    text = json.dumps(value, indent=indent, default=str).encode()
    write_whole(path, lambda fh: fh.write(text))


def read_json(path: str) -> Any:
    """The value at PATH, or None when there is none. Any other failure raises: a store that
    does not answer must not pass for an empty directory (a run would take it over)."""
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as fh:
        return json.loads(fh.read())

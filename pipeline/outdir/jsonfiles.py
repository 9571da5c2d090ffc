"""Small JSON files of DIR (manifests, run records, the lock, summary.json): written whole
under a temporary name and renamed, so a reader sees the old file or the new one."""
from __future__ import annotations

import json
import uuid
from typing import Any

from apache_beam.io.filesystems import FileSystems

TEMP = ".tmp-"   # PATH.tmp-<uuid>: a file being written, renamed to PATH once whole


def write_json(path: str, value: Any, indent: int | None = None) -> None:
    temp = f"{path}{TEMP}{uuid.uuid4().hex}"
    try:
        with FileSystems.create(temp) as fh:
            fh.write(json.dumps(value, indent=indent, default=str).encode())
        FileSystems.rename([temp], [path])   # replaces PATH in one step (os.rename; a copy on object stores)
    except BaseException:
        try:
            FileSystems.delete([temp])
        except Exception:   # never created, or the store refuses: the failure to report is the write's
            pass
        raise


def read_json(path: str) -> Any:
    """The value at PATH, or None when there is none. Any other failure raises: a store that
    does not answer must not pass for an empty directory (a run would take it over)."""
    if not FileSystems.exists(path):
        return None
    with FileSystems.open(path) as fh:
        return json.loads(fh.read())

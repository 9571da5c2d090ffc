"""What an input file was when the run listed it, and whether it still is.

An upstream job that rewrites the corpus while a run reads it (in place, or by renaming a new
file over the old one) would give the run a blend of the two versions, or a row group index
of one version read in the other. The driver stamps each input file when it lists it: its
size, its modification time and the store's checksum of it (S3's ETag, GCS's crc32c; a local
file's size). Each worker checks the stamp when it opens the file, and again when a read of it
fails; the driver checks every stamp once more before it commits the run's view.
"""
from __future__ import annotations

from typing import NamedTuple

from apache_beam.io.filesystems import FileSystems


class Stamp(NamedTuple):
    size: int
    mtime: float
    checksum: str


class InputChanged(Exception):
    """An input file is not what the run listed (a worker's error; the driver names the file)."""

    def __init__(self, path: str, what: str):
        super().__init__(f"{INPUT_FILE}{path} changed while the run read it ({what})")
        self.path, self.what = path, what


INPUT_FILE = "the input file "   # how a worker's message about an input file begins


def stamp(path: str) -> Stamp:
    """PATH's stamp now; an OSError-like BeamIOError when it is gone."""
    meta = FileSystems.get_filesystem(path).metadata(path)
    return Stamp(meta.size_in_bytes, meta.last_updated_in_seconds, str(FileSystems.checksum(path)))


def change(path: str, was: Stamp) -> str | None:
    """What differs between PATH now and WAS, or None when nothing does."""
    try:
        now = stamp(path)
    except Exception:
        return "it is gone"
    if now.size != was.size:
        return f"{was.size} bytes when listed, {now.size} now"
    if now.mtime != was.mtime:
        return "modified since it was listed"
    if now.checksum != was.checksum:
        return f"checksum {was.checksum} when listed, {now.checksum} now"
    return None


def check(path: str, was: Stamp | None) -> None:
    """Raise InputChanged when PATH is not what WAS stamped (no stamp: nothing to check)."""
    if was is not None and (what := change(path, was)) is not None:
        raise InputChanged(path, what)


def first_change(stamps: dict[str, Stamp]) -> InputChanged | None:
    """The first of STAMPS' files that changed, as the error a worker would raise."""
    for path, was in stamps.items():
        if (what := change(path, was)) is not None:
            return InputChanged(path, what)
    return None

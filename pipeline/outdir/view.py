"""DIR's current view: the files that make it up, in one manifest, and the `current` link.

The manifest (`_current.json`, a copy kept as `_views/<view>.json`) is the commit point: one
file replaced in one step. Its files never change once written, so a reader holding a
manifest reads a complete view for as long as that view is kept (`views.keep`). On a local
disk a commit also builds `_views/<view>/`, hard links to the view's reader files, and points
the symlink `current` at it with one rename: a glob on `current/` sees the old view or the new
one, never a mix (a file named in both is the same file). Object stores have no links: there
the manifest, or summary.json's `files`, is the view.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import glob
import os
import shutil
import uuid
from typing import Any

from apache_beam.io.filesystems import FileSystems

from pipeline.outdir import layout
from pipeline.outdir.jsonfiles import read_json, write_json
from transforms.read.changes import Chunking
from transforms.read.parquet import open_parquet, parquet_file
from transforms.schemas import TEXT

FORMAT = 1
TEXT_KINDS = ("embeddings", "staged-embeddings")   # the kinds whose rows carry their chunk's text


@dataclasses.dataclass(frozen=True)
class View:
    view: str                                      # the run that committed it
    model: str
    dimensions: int
    signature: str                                 # hex: transforms/read/changes.py
    kept: tuple[str, ...]
    files: dict[str, tuple[tuple[str, int], ...]]   # kind -> ((relative path, rows), ...)
    docindex: str | None = None
    documents: int = 0                             # in the document index
    committed_at: str = ""
    kept_types: str = ""                           # the kept columns' fields (outdir/kept.py); "": read the files
    chunking: Chunking | None = None               # None: a view of before views recorded it
    textless: tuple[str, ...] | None = None        # files of TEXT_KINDS without the text column;
                                                   # None: not recorded (textless_files reads them)

    def paths(self, kind: str) -> list[str]:
        return [path for path, _ in self.files.get(kind, ())]

    def rows(self, kind: str) -> int:
        return sum(rows for _, rows in self.files.get(kind, ()))

    @property
    def reader_files(self) -> list[str]:
        return [path for kind in layout.READER_KINDS for path in self.paths(kind)]

    @property
    def all_files(self) -> set[str]:
        files = {path for kind in self.files for path in self.paths(kind)}
        return files | {self.docindex} if self.docindex else files

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, **dataclasses.asdict(self),
                "files": {k: [list(f) for f in v] for k, v in self.files.items()},
                "chunking": self.chunking._asdict() if self.chunking else None,
                "textless": None if self.textless is None else list(self.textless)}

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> View:
        fields = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in doc.items() if k in fields}
        values["files"] = {k: tuple((p, int(n)) for p, n in v) for k, v in doc["files"].items()}
        values["kept"] = tuple(doc.get("kept", ()))
        values["chunking"] = Chunking.from_dict(doc.get("chunking"))
        values["textless"] = None if doc.get("textless") is None else tuple(doc["textless"])
        return cls(**values)


def has_text(path: str) -> bool:
    """Whether the embeddings file at PATH has the text column (its footer says)."""
    with open_parquet(path) as fh:
        return TEXT in parquet_file(fh).schema_arrow.names


def textless_files(output_dir: str, view: View) -> set[str]:
    """VIEW's files of TEXT_KINDS without the text column: as its manifest records them, or
    read from their footers (a view committed before manifests recorded them)."""
    if view.textless is not None:
        return set(view.textless)
    return {path for kind in TEXT_KINDS for path in view.paths(kind) if not has_text(layout.join(output_dir, path))}


def rows_without_text(output_dir: str, view: View) -> int:
    """Rows of VIEW's embeddings whose chunk's text is not in the view (null to a reader that
    reads the files as one table): rows written before rows carried it, or without it
    (output.chunk_text: false)."""
    textless = textless_files(output_dir, view)
    return sum(rows for path, rows in view.files.get("embeddings", ()) if path in textless)


def is_local(output_dir: str) -> bool:
    return FileSystems.get_scheme(output_dir) in (None, "file")


def load(output_dir: str, slot: layout.Slot = layout.CURRENT) -> View | None:
    doc = read_json(layout.join(output_dir, slot.pointer))
    return View.from_json(doc) if doc else None


def save(output_dir: str, view: View, slot: layout.Slot = layout.CURRENT) -> View:
    """Make VIEW the one SLOT serves: its manifest, then the pointer (the commit point)."""
    view = dataclasses.replace(view, committed_at=dt.datetime.now(dt.UTC).isoformat())
    write_json(layout.join(output_dir, layout.view_manifest(view.view)), view.to_json())
    write_json(layout.join(output_dir, slot.pointer), view.to_json())
    return view


def link(output_dir: str, view: View, slot: layout.Slot = layout.CURRENT) -> None:
    """Local disks: SLOT's link (`current`) -> a directory of hard links to VIEW's reader files,
    switched in one rename. A file system without hard links gets symbolic ones."""
    if not is_local(output_dir):
        return
    root = output_dir.rstrip("/")
    folder = layout.join(root, layout.view_links(view.view))
    if not os.path.isdir(folder):
        building = f"{folder}.tmp-{uuid.uuid4().hex}"
        os.makedirs(building)
        for path in view.reader_files:
            name = os.path.join(building, path.rsplit("/", 1)[-1])
            try:
                os.link(layout.join(root, path), name)
            except OSError:
                os.symlink(os.path.relpath(layout.join(root, path), folder), name)
        os.rename(building, folder)
    current = layout.join(root, slot.link)
    if os.path.exists(current) and not os.path.islink(current):
        raise FileExistsError(f"{current} is not the link embedpipe keeps: move it away")
    for stale in glob.glob(f"{current}.tmp-*"):   # a switch a kill interrupted
        os.unlink(stale)
    temp = f"{current}.tmp-{uuid.uuid4().hex}"
    os.symlink(layout.view_links(view.view), temp)
    os.replace(temp, current)   # one rename: readers see the old view or the new one


def linked(output_dir: str, slot: layout.Slot = layout.CURRENT) -> str | None:
    """The view SLOT's link points at (local disks), or None."""
    current = layout.join(output_dir, slot.link)
    return os.readlink(current).rsplit("/", 1)[-1] if is_local(output_dir) and os.path.islink(current) else None


def clear(output_dir: str, slot: layout.Slot) -> None:
    """SLOT serves nothing any more: its link, then its pointer (the view's files stay while a
    kept view holds them)."""
    link_path = layout.join(output_dir, slot.link)
    if is_local(output_dir) and os.path.islink(link_path):
        os.unlink(link_path)
    pointer = layout.join(output_dir, slot.pointer)
    if FileSystems.exists(pointer):
        FileSystems.delete([pointer])


def _kept_views(output_dir: str, keep: int) -> list[View]:
    found = FileSystems.match([layout.join(output_dir, f"{layout.VIEWS}/*.json")])[0].metadata_list
    manifests = sorted(m.path for m in found)   # view ids are run ids: they sort by time
    return [View.from_json(doc) for doc in map(read_json, manifests[-keep:]) if doc]


def collect_garbage(output_dir: str, keep: int) -> None:
    """Delete the views older than the KEEP newest, and the derived files (segments) and
    history pending rows none of the kept views holds. History's other files stay: they
    are what was paid, when and by whom."""
    served = [v for v in (load(output_dir), load(output_dir, layout.TARGET)) if v]
    kept = _kept_views(output_dir, keep) + served   # whatever the ids' order
    held = set().union(*(v.all_files for v in kept)) if kept else set()
    names = {v.view for v in kept}
    old = [m.path for m in FileSystems.match([layout.join(output_dir, f"{layout.VIEWS}/*.json")])[0].metadata_list
           if m.path.rsplit("/", 1)[-1][:-len(".json")] not in names]
    derived = [m.path for pattern in (f"{layout.SEGMENTS}/*.parquet", f"{layout.HISTORY}/*/pending-*.parquet")
               for m in FileSystems.match([layout.join(output_dir, pattern)])[0].metadata_list]
    unheld = [p for p in derived if layout.relative(output_dir, p) not in held]
    if old + unheld:
        FileSystems.delete(old + unheld)
    if is_local(output_dir):
        views = layout.join(output_dir, layout.VIEWS)
        for name in os.listdir(views) if os.path.isdir(views) else ():
            if os.path.isdir(os.path.join(views, name)) and name not in names:
                shutil.rmtree(os.path.join(views, name), ignore_errors=True)

"""The store of paid texts (the library's `store=`): each answer is kept there as soon as it is
paid, keyed by (model, dimensions, text digest), and a text it holds is never sent again, by a
later run, a retried bundle or another pipeline on the same store (the CLI's index of paid
texts is known.py: why two, there). No Beam step here.

Layout, on any Beam filesystem (a local directory, s3://, gs://):
  STORE/_journal/<run>/<request>.parquet  one answered request, written by the CLI's journal
      (transforms/money/journal.py: a temporary name, then a rename) right after it is paid;
      `<request>.intent.json` beside it before the request leaves
  STORE/_compacted/<id>.parquet  entries merged by compaction.py, one file per model and length:
      the columns of an embeddings file that reuse reads (text_sha256, model, request_id,
      n_tokens, embedding)
Every name is written once, under a name no other writer uses, so pipelines on one store at
once never overwrite each other; readers take a file that appears later at their next refresh
and one that compaction removed by listing again. A listing reads the journal before the
compacted files and lists again when a file it named is gone before it is read: compaction
renames its merged file in before it deletes what it merged, so whatever it runs between
those steps, each text is in a file the listing reads. A CLI output DIR is read the same way
(its history's embeddings files and its journal), never written nor compacted.

Per worker process (`PaidStore.shared(spec, model, dims, run_id)`), for one model and length:
  found = store.lookup(shas)      # {sha: Found(vector, request_id, n_tokens)}: costs nothing
  store.put(request_row, shas, n_tokens, vectors, shares_micro)  # as soon as it is paid
  store.recall(run_id, request_id)   # a retried bundle's answer, by its request id
(intents and the entries' space: as in DIR's journal, by the Sender, transforms/embed/sender.py)
A text paid in this process is found at once; one paid elsewhere, after the next refresh
(StoreSpec.refresh_s). Growth: one entry per paid request, never pruned (a text paid once
may come back); compaction.py merges entries into large files, safe beside writers and readers.
"""
from __future__ import annotations

import atexit
import collections
import json
import shutil
import tempfile
import threading
import time
from typing import NamedTuple
from collections.abc import Sequence

import numpy as np
from apache_beam.io.filesystems import FileSystems

from transforms.dedupe.known import read_vectors
from transforms.files import missing
from transforms.money import journal
from transforms.read.parquet import open_parquet, parquet_file
from transforms.worker import runscoped
from transforms.worker.keyindex import KeyIndex, key16

COMPACTED = "_compacted"
SCOPE = "paid-store"      # the process-wide objects' scope (transforms/worker/runscoped.py)
# An output DIR of the CLI, its first run's start included (pipeline/outdir/layout.py): read, never written
CLI_MARKERS = ("_current.json", "summary.json", "_lock.json", "_runs/*", "history/*/*")
GLOB_CHARS = "*?["   # Beam's filesystems list a location as a pattern: with these, other files or none


class StoreError(Exception):
    """A store location that cannot be used (one line, names it)."""


class StoreSpec(NamedTuple):
    """Where paid texts are kept: PATH is read and written (None: no store); READ, other
    stores or CLI output DIRs, read only. SPOOL, without PATH: a temporary directory of each
    worker process, for one pipeline (what its rows find again), removed when the process ends."""
    path: str | None = None
    read: tuple[str, ...] = ()
    spool: bool = False
    refresh_s: float = 60.0   # configs/pipeline.yaml store.refresh_s: how often a worker lists it again

    @property
    def locations(self) -> tuple[str, ...]:
        return ((self.path,) if self.path else ()) + self.read

    def __bool__(self) -> bool:
        return bool(self.locations) or self.spool


def cli_output_dir(location: str) -> bool:
    """Whether LOCATION holds anything of a CLI output DIR's layout."""
    patterns = [FileSystems.join(location, *marker.split("/")) for marker in CLI_MARKERS]
    return any(result.metadata_list for result in FileSystems.match(patterns, limits=[1] * len(patterns)))


def plain(location: str, name: str = "store") -> str:
    """LOCATION, refused when Beam's filesystems would read it as a pattern."""
    if any(c in location for c in GLOB_CHARS):
        raise StoreError(f"{name}={location}: a location with * ? or [ in its name is read as a pattern by Beam's "
                         "filesystems (another location's files, or none): give one without them")
    return location


def spec(store: str | None, read: Sequence[str] = (), refresh_s: float = 60.0) -> StoreSpec:
    """The store a transform is given, checked in the driver: a location read as a pattern is
    refused, a CLI output DIR is read only."""
    for location in read:
        plain(location, "read_stores")
    if store and cli_output_dir(plain(store)):
        raise StoreError(f"store={store} is an output DIR of the CLI: give it in read_stores= to take its "
                         f"vectors, and another location as store=")
    return StoreSpec(store or None, tuple(read), refresh_s=refresh_s)


class Found(NamedTuple):
    vector: np.ndarray
    request_id: str | None
    n_tokens: int | None


def _spool() -> str:
    path = tempfile.mkdtemp(prefix="embedpipe-spool-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _matching(patterns: list[str]) -> list[str]:
    return sorted(m.path for result in FileSystems.match(patterns) for m in result.metadata_list)


def listing(location: str) -> tuple[list[str], list[str]]:
    """(files read as embeddings files, journal entries) under LOCATION; none if it is missing.
    The journal first: an entry merged after it was listed is in a file listed after it (or,
    when that file came later still, the entry is gone when read, and the caller lists again)."""
    entries = _matching([FileSystems.join(journal.journal_dir(location), "*", "*.parquet")])
    files = _matching([FileSystems.join(location, COMPACTED, "*.parquet"),
                       FileSystems.join(location, "history", "*", "embeddings-*.parquet")])
    return files, entries


def _file_rows(path: str, model: str, dims: int):
    """(row group, row, sha, request id, n_tokens) of an embeddings or compacted file's rows of MODEL at DIMS."""
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        schema = parquet.schema_arrow
        if schema.field("embedding").type.list_size != dims:
            return
        columns = ["text_sha256", "model", "request_id", "n_tokens"]
        for g in range(parquet.metadata.num_row_groups):
            t = parquet.read_row_group(g, columns=columns)
            for row, (sha, m, rid, n) in enumerate(zip(*(t.column(c).to_pylist() for c in columns), strict=True)):
                if m == model:
                    yield g, row, sha, rid, n


def _entry_rows(path: str, model: str, dims: int):
    """The same for a journal entry (one request): its footer names the model; the vectors are
    not read."""
    with open_parquet(path) as fh:
        parquet = parquet_file(fh)
        schema = parquet.schema_arrow
        request = json.loads(schema.metadata[b"request"])
        if request["model"] != model or journal.vector_dims(schema.field("embedding").type) != dims:
            return
        table = parquet.read(columns=["text_sha256", "n_tokens"])
    for row, (sha, n) in enumerate(zip(table.column("text_sha256").to_pylist(), table.column("n_tokens").to_pylist(), strict=True)):
        yield 0, row, sha, request["request_id"], n


class PaidStore:
    """One process's index of the texts SPEC holds for MODEL at DIMS: digest -> where its vector
    is (~50 bytes a text), never the vector; vectors are read when asked for, a few files cached."""

    CACHED = 4

    def __init__(self, spec: StoreSpec, model: str, dims: int):
        self.spec, self.model, self.dims, self._refresh_s = spec, model, dims, spec.refresh_s
        self._lock = threading.RLock()
        self._reset()   # the index: digest -> file number, row group, row, request number, tokens (int32s)
        self._requests: list[str | None] = []
        self._request_numbers: dict[str | None, int] = {}
        self._listed_at = 0.0
        self._runs: set[str] = set()
        self.refresh()

    @classmethod
    def shared(cls, spec: StoreSpec, model: str, dims: int, run_id: str) -> PaidStore:
        """This process's PaidStore of SPEC for MODEL at DIMS (built on first use), listed again
        when another run (RUN_ID: a pipeline, or a worker's model) first asks for it."""
        if spec.spool and not spec.path:   # this pipeline's own, in this process
            return runscoped.shared(run_id, f"spool|{model}|{dims}", lambda: cls(spec._replace(path=_spool()),
                                                                                  model, dims))
        store = runscoped.shared(SCOPE, f"{spec}|{model}|{dims}", lambda: cls(spec, model, dims))
        with store._lock:
            if run_id not in store._runs:
                if store._runs:
                    store.refresh()
                store._runs.add(run_id)
        return store

    @property
    def size(self) -> int:
        """Texts indexed (a PaidStore has no len(): an empty one is still a store)."""
        return len(self._index)

    # -- reading ---------------------------------------------------------------------------

    def refresh(self) -> None:
        """Index what appeared in the stores since the last listing (entries another process
        or pipeline wrote, a compaction's files); when a file indexed before has gone (compacted),
        index the stores again from scratch. A file listed and gone before it was read was
        merged meanwhile, into a file this listing may have missed: list again."""
        with self._lock:
            self._listed_at = time.monotonic()
            gone = True
            while gone:
                listed = [listing(location) for location in self.spec.locations]
                paths = {p for files, entries in listed for p in files + entries}
                if any(path not in paths for path, _ in self._files):
                    self._reset()
                gone = False
                for files, entries in listed:
                    for path in files:
                        gone |= not self._add(path, False, _file_rows)
                    for path in entries:
                        gone |= not self._add(path, True, _entry_rows)

    def _reset(self) -> None:
        self._index = KeyIndex()
        self._files: list[tuple[str, bool]] = []   # (path, journaled)
        self._numbers: dict[str, int] = {}
        self._cache: collections.OrderedDict = collections.OrderedDict()

    def _add(self, path: str, journaled: bool, rows) -> bool:
        """Index PATH's texts; False if it is gone (removed by a compaction since the listing)."""
        if path in self._numbers:
            return True
        number = len(self._files)
        try:
            found = list(rows(path, self.model, self.dims))
        except Exception as exc:
            if missing(exc):
                return False
            raise
        self._files.append((path, journaled))
        self._numbers[path] = number
        for g, row, sha, request_id, n_tokens in found:
            self._put(key16(sha), number, g, row, request_id, n_tokens)
        return True

    def _put(self, key: bytes, number: int, row_group: int, row: int, request_id: str | None,
             n_tokens: int | None) -> None:
        """The first place of a text wins."""
        if key not in self._index:
            self._index.put(key, np.array([number, row_group, row, self._request_number(request_id),
                                           -1 if n_tokens is None else n_tokens], "<i4").tobytes())

    def _request_number(self, request_id: str | None) -> int:
        if request_id not in self._request_numbers:
            self._request_numbers[request_id] = len(self._requests)
            self._requests.append(request_id)
        return self._request_numbers[request_id]

    def holds(self, sha: str) -> bool:
        return self.holds_key(key16(sha))

    def holds_key(self, key: bytes) -> bool:
        """Whether the text of KEY (transforms/worker/keyindex.key16 of its digest) is held."""
        with self._lock:
            self._refresh_when_due()
            return key in self._index

    def _refresh_when_due(self) -> None:
        if time.monotonic() - self._listed_at >= self._refresh_s:
            self.refresh()

    def lookup(self, shas: Sequence[str]) -> dict[str, Found]:
        """The vectors the stores hold among SHAS (text digests), with the request that paid each."""
        with self._lock:
            self._refresh_when_due()
            found = {}
            for sha in shas:
                place = self._place(sha)
                if place is None:
                    continue
                vector = self._vector(*place[:3])
                if vector is None:   # compacted away under us: list again, once
                    self.refresh()
                    place = self._place(sha)
                    vector = None if place is None else self._vector(*place[:3])
                if vector is not None:
                    found[sha] = Found(vector, self._requests[place[3]], None if place[4] < 0 else place[4])
            return found

    def _place(self, sha: str):
        held = self._index.get(key16(sha))
        return None if held is None else tuple(int(v) for v in np.frombuffer(held, "<i4"))

    def _vector(self, number: int, row_group: int, row: int) -> np.ndarray | None:
        path, journaled = self._files[number]
        key = (path, row_group)
        if key not in self._cache:
            try:
                self._cache[key] = read_vectors(path, row_group, journaled)
            except Exception as exc:
                if not missing(exc):
                    raise
                return None
            if len(self._cache) > self.CACHED:
                self._cache.popitem(last=False)
        self._cache.move_to_end(key)
        return self._cache[key][row]

    # -- writing ---------------------------------------------------------------------------

    def put(self, request_row: dict, shas: Sequence[str], n_tokens: Sequence[int], vectors: np.ndarray,
            shares_micro: Sequence[int]) -> None:
        """An answered request (REQUEST_ROW as RequestRunner makes it), as soon as it is paid: in
        the store for good, and in this process's index at once."""
        if not self.spec.path:
            return
        path = journal.write_entry(self.spec.path, request_row["run_id"], request_row, list(shas), list(n_tokens),
                                   vectors, list(shares_micro))
        with self._lock:
            if path in self._numbers:
                return
            self._numbers[path] = number = len(self._files)
            self._files.append((path, True))
            for row, (sha, n) in enumerate(zip(shas, n_tokens, strict=True)):
                self._put(key16(sha), number, 0, row, request_row["request_id"], n)

    def recall(self, run_id: str, request_id: str):
        """RUN_ID's answer to REQUEST_ID if an earlier attempt of a bundle paid for it (RequestRunner's recall)."""
        return journal.read_entry(self.spec.path, run_id, request_id) if self.spec.path else None

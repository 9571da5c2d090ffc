"""The next current view of DIR, from the last one and what a run's job wrote.

Per document the run worked on (its `changes` rows, transforms/read/changes.py), or removed:

| the run's change                       | complete after the run          | not complete (pending rows)          |
|----------------------------------------|---------------------------------|--------------------------------------|
| added (no version in DIR)              | served                          | served as far as it goes             |
| edited (DIR serves another version)    | served; the old rows leave      | staged; the old version stays served |
|   ... whose served version is partial  | served; the old rows leave      | served as far as it goes; old rows leave |
| resumed (the version DIR was building) | promoted from staged, or served | staged, or served as far as it goes  |
| removed (--sync: not in the input)     | every row leaves                |                                      |

So a reader never sees two versions of a document, nor a new version before it is complete
(only a document DIR had no version of shows as far as it goes, as before). Every pending
row of a document the run worked on is decided again by the run. A resumed document whose
chunks were split again from the input replaces the rows of those chunks; one resumed from
DIR's pending rows (--resume without --input) keeps them.

The decision is made on whole columns (pyarrow), never a Python object per document: a
first run decides for every document of the corpus.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.outdir import kept, layout, space
from pipeline.outdir.view import TEXT_KINDS, View, has_text, textless_files
from transforms.read.changes import CHANGES_SCHEMA, DOCINDEX, FINGERPRINT, RESUMED
from transforms.read.parquet import read_tables, row_count
from transforms.write.rewrite import Rules, Task, chunk_keys, count, save_rules
from transforms.write.transform import Codec, open_writer

# Where the rows that move from a file of one kind go.
MOVES = {"staged-embeddings": "embeddings", "staged-failed": "failed",
         "embeddings": "staged-embeddings", "failed": "staged-failed"}
SERVED, FAILED, PENDING, STAGED, THIS_RUN, KEEP = "served", "failed", "pending", "staged", "this_run", "keep"
RULES_OF_PREVIOUS = {"embeddings": SERVED, "failed": FAILED, "documents": SERVED, "pending": PENDING,
                     "staged-embeddings": STAGED, "staged-failed": STAGED}


@dataclasses.dataclass(frozen=True)
class Decision:
    rules: dict                  # SERVED, PENDING, STAGED, THIS_RUN -> Rules
    entries: pa.Table            # DOCINDEX rows of the documents the run worked on
    gone: pa.Array               # ids whose index rows are replaced (by ENTRIES) or removed


def _read(paths: list[str], columns: list[str], schema: pa.Schema) -> pa.Table:
    tables = read_tables(paths, columns)
    return pa.concat_tables(tables).cast(schema) if tables else schema.empty_table()


def _distinct_changes(changes: pa.Table) -> pa.Table:
    """One row per document (a repeated id, or a document resumed from several tables of
    pending rows, comes more than once, always with the same change)."""
    if not changes.num_rows:
        return changes
    first = changes.group_by("doc_id", use_threads=False).aggregate(
        [("change", "first"), ("fingerprint", "first")])
    return first.rename_columns(["doc_id", "change", "fingerprint"])


def _todo_lists(pending: pa.Table) -> pa.Table:
    """doc_id, todo: each document's pending chunk indexes, sorted, once each."""
    pairs = pending.group_by(["doc_id", "chunk_index"], use_threads=False).aggregate([])
    pairs = pairs.sort_by([("doc_id", "ascending"), ("chunk_index", "ascending")])
    lists = pairs.group_by("doc_id", use_threads=False).aggregate([("chunk_index", "list")])
    return lists.rename_columns(["doc_id", "todo"]).cast(pa.schema([DOCINDEX.field("doc_id"),
                                                                   DOCINDEX.field("todo")]))


def _lookup(keys, table: pa.Table, column: str):
    """TABLE's COLUMN at the row of each key (null where the key is not in table.doc_id)."""
    return table.column(column).take(pc.index_in(keys, value_set=table.column("doc_id")))


def _array(values) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def _union(*arrays) -> pa.Array:
    return pa.concat_arrays([_array(a) for a in arrays])


def _exploded_keys(doc_ids: pa.Array, lists: pa.Array) -> pa.Array:
    """chunk_keys of every (doc, chunk) of each document's list of chunk indexes."""
    if not len(lists):
        return pa.array([], pa.string())
    return _array(chunk_keys(pc.take(doc_ids, pc.list_parent_indices(lists)), pc.list_flatten(lists)))


def decide(changes: pa.Table, previous: pa.Table, pending: pa.Table, removed: pa.Array,
           read_input: bool, renew: bool = False) -> Decision:
    """The table of the module's docstring, on columns. CHANGES: the run's (CHANGES_SCHEMA);
    PREVIOUS: the last view's document index rows of those documents (DOCINDEX); PENDING: the
    run's pending rows (doc_id, chunk_index); REMOVED: ids that leave the view. RENEW: the
    run changes the view's kept columns, which no old row has: every document's rows are the
    run's, an incomplete new version served as far as it goes."""
    changes = _distinct_changes(changes)
    doc, fp = _array(changes.column("doc_id")), _array(changes.column("fingerprint"))
    served, target, old_todo = (_lookup(doc, previous, c) for c in ("served", "target", "todo"))
    todo = _lookup(doc, _todo_lists(pending), "todo")
    known = pc.is_valid(pc.index_in(doc, value_set=previous.column("doc_id")))
    resumed = pc.and_(pc.equal(changes.column("change"), RESUMED), known)
    if pc.any(pc.and_(pc.equal(changes.column("change"), RESUMED), pc.invert(known))).as_py():
        raise ValueError("a document was resumed that DIR's current view does not hold")
    building_target = pc.and_(resumed, pc.is_valid(target))
    edited = pc.and_(pc.invert(resumed), known)
    complete = pc.is_null(todo)
    # the version readers see is complete (a target is built only beside a complete one):
    # an edit waits behind it; an edit of a version served as far as it went replaces it
    served_complete = pc.or_(pc.is_valid(target), pc.is_null(old_todo))
    if renew:
        served_complete = pa.array([False] * len(doc), pa.bool_())
    replace = pc.and_(edited, pc.or_(complete, pc.invert(served_complete)))
    promote = pc.and_(building_target, complete)
    stage = pc.and_(pc.or_(building_target, pc.and_(edited, served_complete)), pc.invert(complete))
    new_served = pc.if_else(pc.or_(pc.invert(known), replace), fp, pc.if_else(promote, target, served))
    nulls = pa.nulls(len(doc), FINGERPRINT)
    new_target = pc.if_else(stage, pc.if_else(building_target, target, fp), nulls)
    entries = pa.table([doc, new_served, new_target, todo], schema=DOCINDEX)
    resplit = read_input   # chunks split again from the input replace their earlier rows

    def docs(mask) -> pa.Array:
        return _array(pc.filter(doc, mask))

    def keys(mask) -> pa.Array:
        return (_exploded_keys(pc.filter(doc, mask), _array(pc.filter(old_todo, mask)))
                if resplit else pa.array([], pa.string()))

    removed = _array(removed).cast(pa.string())
    served_rules = Rules(_union(docs(pc.or_(promote, replace)), removed),
                         keys(pc.and_(resumed, pc.invert(building_target))))
    rules = {
        SERVED: served_rules,
        FAILED: served_rules._replace(drop_null_ids=read_input),   # rows without an id come again
        PENDING: Rules(_union(doc, removed)),
        STAGED: Rules(_union(docs(edited), removed), keys(building_target), docs(promote)),
        THIS_RUN: Rules(move_docs=docs(stage)),
    }
    return Decision(rules, entries, _union(doc, removed))


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """What a run's job wrote (paths relative to DIR), by kind, and how its input was read."""
    run_id: str
    files: dict                 # kind -> [relative path]
    read_input: bool            # False: --resume without --input (DIR's pending rows were the input)
    removed: pa.Array           # --sync: ids of the view that are not in the input
    requests: tuple = ()        # every requests file of DIR's history: a view holds them all
    text: bool = True           # its embeddings files have the text column


Rewrite = Callable[[list[Task], str], None]   # the tasks, the path of their rules (save_rules)


class _Files:
    """The next view's files, gathered kind by kind; rewrites become tasks. STALE: files whose
    kept columns are cast to CAST_TO (pipeline/outdir/kept.py), whether or not rows leave them.
    TEXTLESS: those of TEXT_KINDS without the text column (a rewritten file has its source's
    columns)."""

    def __init__(self, output_dir: str, view_id: str, rules: dict, stale: frozenset[str] = frozenset(),
                 cast_to: bytes | None = None):
        self._out, self._view, self._rules = output_dir, view_id, rules
        self._stale, self._cast_to = stale, cast_to
        self.files: dict[str, list] = {kind: [] for kind in layout.KINDS}
        self.tasks: list[Task] = []
        self.textless: list[str] = []

    def _keep(self, kind: str, path: str, rows: int, textless: bool) -> None:
        self.files[kind].append((path, rows))
        if textless and kind in TEXT_KINDS:
            self.textless.append(path)

    def add(self, kind: str, path: str, rules_name: str | None, rows: int | None = None,
            textless: bool = False) -> None:
        rules = self._rules.get(rules_name)
        cast = path in self._stale
        if rules_name is None or rules is None or (rules.empty and not cast):
            rows = row_count(layout.join(self._out, path)) if rows is None else rows
            if rows:
                self._keep(kind, path, rows, textless)
            return
        rows, dropped, moved = count(layout.join(self._out, path), rules)
        if not dropped and not moved and not cast:
            if rows:
                self._keep(kind, path, rows, textless)
            return
        stays, n = rows - dropped - moved, len(self.tasks)
        stays_to = layout.segment(kind, self._view, 2 * n) if stays else None
        moves_to = layout.segment(MOVES[kind], self._view, 2 * n + 1) if moved else None
        if stays_to:
            self._keep(kind, stays_to, stays, textless)
        if moves_to:
            self._keep(MOVES[kind], moves_to, moved, textless)
        if stays_to or moves_to:
            self.tasks.append(Task(layout.join(self._out, path), rules_name,
                                   stays_to and layout.join(self._out, stays_to),
                                   moves_to and layout.join(self._out, moves_to), self._cast_to if cast else None))

    def pad_text(self) -> None:
        """Files of TEXT_KINDS without the text column get a null one when others have it (a
        view written before rows carried their text, read again in part; a run without text on
        a view with it): the view stays one schema. Those written again get it as they are
        written; the others are copied with it."""
        written = {p: i for i, t in enumerate(self.tasks) for p in (t.stays_to, t.moves_to) if p}   # full paths

        def source(path: str) -> str:
            full = layout.join(self._out, path)
            return self.tasks[written[full]].source if full in written else full

        paths = {path for kind in TEXT_KINDS for path, _ in self.files[kind]}
        lacking = {path for path in set(self.textless) & paths if not has_text(source(path))}
        if not lacking or lacking == paths:
            return
        for kind in TEXT_KINDS:
            for i, (path, rows) in enumerate(self.files[kind]):
                full = layout.join(self._out, path)
                if path not in lacking:
                    continue
                if full in written:
                    self.tasks[written[full]] = self.tasks[written[full]]._replace(pad_text=True)
                else:
                    copy = layout.segment(kind, self._view, 2 * len(self.tasks))
                    self.tasks.append(Task(full, KEEP, layout.join(self._out, copy), None, pad_text=True))
                    self.files[kind][i] = (copy, rows)
                    self.textless[self.textless.index(path)] = copy


def sizes(paths: list[str]) -> int:
    """Bytes of the files at PATHS."""
    found = FileSystems.match(paths) if paths else []
    return sum(m.size_in_bytes for result in found for m in result.metadata_list)


def rewrites_at_most(output_dir: str, view: View | None) -> int:
    """Bytes a commit after VIEW writes again at most: every file of it that rows may leave or
    move from (all but the requests), and its document index once more."""
    if view is None:
        return 0
    paths = [p for kind in RULES_OF_PREVIOUS for p in view.paths(kind)] + ([view.docindex] if view.docindex else [])
    return sizes([layout.join(output_dir, p) for p in paths])


def _write_index(output_dir: str, path: str, table: pa.Table, codec: Codec) -> None:
    with FileSystems.create(layout.join(output_dir, path)) as sink:
        writer = open_writer(sink, DOCINDEX, codec)
        writer.write_table(table)
        writer.close()


def next_view(output_dir: str, previous: View | None, run: RunFiles, template: View, codec: Codec,
              rewrite: Rewrite) -> View:
    """The view after RUN, its files written (not yet made current: view.save does that).
    TEMPLATE carries the model, dimensions, signature and kept columns."""
    def files(kind: str) -> list[str]:
        return [layout.join(output_dir, p) for p in run.files.get(kind, [])]

    changes = _read(files("changes"), CHANGES_SCHEMA.names, CHANGES_SCHEMA)
    pending = _read(files("pending"), ["doc_id", "chunk_index"],
                    pa.schema([DOCINDEX.field("doc_id"), pa.field("chunk_index", pa.int32())]))
    index = (_read([layout.join(output_dir, previous.docindex)], DOCINDEX.names, DOCINDEX)
             if previous and previous.docindex else DOCINDEX.empty_table())
    touched = pc.is_in(index.column("doc_id"), value_set=_array(changes.column("doc_id")))
    renew = previous is not None and previous.kept != template.kept
    decision = decide(changes, index.filter(touched), pending, run.removed, run.read_input, renew)
    fields = kept.decode(template.kept_types) if template.kept_types else None
    if previous is None or renew or fields is None:
        gathered = _Files(output_dir, run.run_id, decision.rules)
    else:   # a widened kept column: the files of other types are cast
        stale = kept.stale_files(output_dir, previous, fields)
        gathered = _Files(output_dir, run.run_id, decision.rules, stale, kept.serialized(fields) if stale else None)
    textless = textless_files(output_dir, previous) if previous else set()
    for kind, rules_name in RULES_OF_PREVIOUS.items():
        for path, rows in (previous.files.get(kind, ()) if previous else ()):
            gathered.add(kind, path, rules_name, rows, path in textless)
    for kind in layout.READER_KINDS:
        for path in run.requests if kind == "requests" else run.files.get(kind, []):
            gathered.add(kind, path, THIS_RUN if kind in MOVES else None, textless=not run.text)
    gathered.pad_text()
    docindex = layout.docindex(run.run_id)
    try:
        if gathered.tasks:
            rules = layout.join(output_dir, layout.segment("rules", run.run_id, 0))
            save_rules(rules, {**decision.rules, KEEP: Rules()})
            rewrite(gathered.tasks, rules)
        stays = index.filter(pc.invert(pc.is_in(index.column("doc_id"), value_set=decision.gone)))
        new_index = pa.concat_tables([stays, decision.entries])
        _write_index(output_dir, docindex, new_index, codec)
    except Exception as exc:
        if not space.is_full(exc):
            raise
        # a file written again is at most its source; the next index, at most the columns of both in memory
        raise space.Full(sizes([t.source for t in gathered.tasks]) + index.nbytes + decision.entries.nbytes) from exc
    return dataclasses.replace(template, view=run.run_id, docindex=docindex, documents=new_index.num_rows,
                               files={k: tuple(v) for k, v in gathered.files.items() if v},
                               textless=tuple(gathered.textless))

"""A switch of DIR to another model (or chunking): its record, where it stands, and the step
that ends it.

While DIR switches from model A to B (or from A's chunks to other chunks: all below holds
alike), `current` keeps serving A and the target slot (`target`, `_target.json`: layout.py)
holds B's view, built by the same commit as any view. The record `_switch.json` says from
what to what, and which runs built the target (what B cost so far is their requests). The switch ends when the target holds the whole corpus of the day, complete:
its view becomes the current one (one manifest written, one link renamed), then the target
slot and the record go. A kill between those steps leaves a record whose target is already
current: `settle` finishes it.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io.filesystems import FileSystems

from pipeline.outdir import OutputDir, layout
from pipeline.outdir.jsonfiles import read_json, write_json
from pipeline.outdir.view import View
from transforms.money import journal
from transforms.money.apportion import from_micro, to_micro
from transforms.read.changes import Chunking
from transforms.read.parquet import read_tables


@dataclasses.dataclass(frozen=True)
class Switch:
    from_model: str
    from_dimensions: int
    to_model: str
    to_dimensions: int
    started_at: str
    runs: tuple[str, ...] = ()   # the runs that built the target
    from_chunking: Chunking | None = None   # None: a record of before records said it
    to_chunking: Chunking | None = None

    def ends_in(self, view: View) -> bool:
        """Whether VIEW is what the switch builds (a record that does not say the chunking: any)."""
        return (view.model, view.dimensions) == (self.to_model, self.to_dimensions) and \
            self.to_chunking in (None, view.chunking)

    @classmethod
    def start(cls, view: View, chunking: Chunking, model: str, dimensions: int, to_chunking: Chunking) -> Switch:
        return cls(view.model, view.dimensions, model, dimensions, dt.datetime.now(dt.UTC).isoformat(),
                   from_chunking=chunking, to_chunking=to_chunking)


def load(out: OutputDir) -> Switch | None:
    doc = read_json(out.join(layout.SWITCH))
    if not doc:
        return None
    chunkings = {k: Chunking.from_dict(doc.get(k)) for k in ("from_chunking", "to_chunking")}
    return Switch(**{**doc, "runs": tuple(doc.get("runs", ())), **chunkings})


def save(out: OutputDir, switch: Switch) -> None:
    doc = dataclasses.asdict(switch)
    doc.update({k: c._asdict() if c else None for k, c in (("from_chunking", switch.from_chunking),
                                                             ("to_chunking", switch.to_chunking))})
    write_json(out.join(layout.SWITCH), doc)


def add_run(out: OutputDir, switch: Switch, run_id: str) -> Switch:
    """Recorded before the run's first request: what B cost counts it from then on."""
    switch = dataclasses.replace(switch, runs=switch.runs + (run_id,))
    save(out, switch)
    return switch


def end(out: OutputDir) -> None:
    """The target slot and the record go (the target's vectors stay in history: a later switch
    to that model reuses them)."""
    out.target().clear()
    path = out.join(layout.SWITCH)
    if FileSystems.exists(path):
        FileSystems.delete([path])


def settle(out: OutputDir) -> None:
    """A switch whose last step a kill interrupted: its target is current already."""
    switch, view = load(out), out.view
    if switch is not None and view is not None and switch.ends_in(view) \
            and ((target := out.target().view) is None or target.view == view.view):
        end(out)


def promote(out: OutputDir) -> View:
    """The target's view becomes the current one, in one step, then the switch ends."""
    target = out.target().view
    if target is None:   # covers() said it holds the corpus
        raise RuntimeError(f"{out.path}: the switch has no target view to promote")
    view = out.serve(target)
    end(out)
    return view


def spent_rub(out: OutputDir, switch: Switch) -> float:
    """What the target's runs paid: their requests, written or still in a killed run's journal."""
    runs = set(switch.runs)
    seen, micro = set(), 0
    for table in read_tables(out.history_files("requests"), ["request_id", "run_id", "cost_rub"]):
        for request_id, run_id, cost in zip(*(table.column(c).to_pylist() for c in ("request_id", "run_id",
                                                                                     "cost_rub")), strict=True):
            if run_id in runs and request_id not in seen:
                seen.add(request_id)
                micro += to_micro(cost or 0)
    for row in journal.read_requests(out.path, skip=seen):
        if row["run_id"] in runs:
            micro += to_micro(row["cost_rub"] or 0)
    return from_micro(micro)


def _done(target: View | None, out: OutputDir, ids: pa.Array) -> int:
    """Documents of IDS the target serves in the version of the day, complete."""
    if target is None or target.docindex is None:
        return 0
    tables = read_tables([out.join(target.docindex)], ["doc_id", "target", "todo"])
    if not tables:
        return 0
    index = pa.concat_tables(tables)
    settled = pc.and_(pc.is_null(index.column("target")), pc.is_null(index.column("todo")))
    return pc.sum(pc.and_(settled, pc.is_in(index.column("doc_id"), value_set=ids))).as_py() or 0


def covers(out: OutputDir, ids: pa.Array) -> bool:
    """Whether the target holds the whole corpus of the day (IDS), every document complete."""
    target = out.target().view
    if target is None or target.rows("pending") or target.rows("staged-embeddings") or target.rows("staged-failed"):
        return False
    return target.documents == len(ids) == _done(target, out, ids)


def _pending_tokens(out: OutputDir, view: View | None) -> int:
    """Tokens of the target's distinct pending texts: what is left to pay for, as far as it was read."""
    if view is None:
        return 0
    tables = read_tables([out.join(p) for p in view.paths("pending")], ["text_sha256", "n_tokens"])
    if not tables:
        return 0
    distinct = pa.concat_tables(tables).group_by("text_sha256").aggregate([("n_tokens", "max")])
    return pc.sum(distinct.column("n_tokens_max")).as_py() or 0


def status(out: OutputDir, switch: Switch, ids: pa.Array | None, price: float, switched: bool) -> dict[str, Any]:
    """summary.json's `switch`. IDS: the distinct ids of the day's corpus (None when the run
    read no input); PRICE: RUB per token of the target's model. The estimate to finish prices
    the target's pending texts, and documents it has not read yet at the served view's mean."""
    target = None if switched else out.target().view
    total = len(ids) if ids is not None else (out.view.documents if out.view else 0)
    done = total if switched else _done(target, out, ids if ids is not None else pa.array([], pa.string()))
    tokens = _pending_tokens(out, target)
    unread = 0 if switched else max(0, total - (target.documents if target else 0))
    if unread and out.view is not None and out.view.documents:
        served_tokens = sum(pc.sum(t.column("n_tokens")).as_py() or 0
                            for t in read_tables([out.join(p) for p in out.view.paths("embeddings")], ["n_tokens"]))
        tokens += round(unread * served_tokens / out.view.documents)
    return {"from": side(switch.from_model, switch.from_dimensions, switch.from_chunking),
            "to": side(switch.to_model, switch.to_dimensions, switch.to_chunking),
            "started_at": switch.started_at, "runs": list(switch.runs),
            "documents_done": done, "documents_total": total,
            "spent_rub": spent_rub(out, switch),
            "estimated_rub_to_finish": 0.0 if switched else round(tokens * price, 6),
            "switched": switched,
            "view": None if switched else f"{layout.TARGET.link}/",
            "manifest": None if switched else layout.TARGET.pointer,
            "files": [] if switched or target is None else target.reader_files}


def side(model: str, dimensions: int, chunking: Chunking | None) -> dict[str, Any]:
    """summary.json's `from` or `to`: the model, its length and its chunks (when recorded)."""
    side: dict[str, Any] = {"model": model, "dimensions": dimensions}
    if chunking is not None:
        side.update(chunk_tokens=chunking.chunk_tokens, overlap_tokens=chunking.overlap_tokens)
    return side

"""The commit's decision per document (pipeline/outdir/commit.py), and the file rewrites it
leads to (transforms/write/rewrite.py), on small tables and real Parquet files; no Beam."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.outdir.commit import FAILED, PENDING, SERVED, STAGED, THIS_RUN, decide
from transforms.read.changes import CHANGES_SCHEMA, DOCINDEX
from transforms.write.rewrite import Rules, Task, count, split_file
from transforms.write.transform import Codec


def fp(n: int) -> bytes:
    return bytes([n]) * 16


PREVIOUS = pa.Table.from_pylist([
    {"doc_id": "edited-done", "served": fp(1), "target": None, "todo": None},
    {"doc_id": "edited-half", "served": fp(2), "target": None, "todo": None},
    {"doc_id": "partial", "served": fp(3), "target": None, "todo": [2, 3]},
    {"doc_id": "target", "served": fp(4), "target": fp(5), "todo": [1]},
], schema=DOCINDEX)


def changes(*rows) -> pa.Table:
    return pa.Table.from_pylist([dict(zip(("doc_id", "change", "fingerprint"), r, strict=True)) for r in rows],
                                schema=CHANGES_SCHEMA)


def pending(*pairs) -> pa.Table:
    return pa.table({"doc_id": [d for d, _ in pairs], "chunk_index": pa.array([c for _, c in pairs], pa.int32())})


def ids(array) -> list:
    return sorted(array.to_pylist())


def entries(decision) -> dict:
    return {r["doc_id"]: (r["served"], r["target"], r["todo"]) for r in decision.entries.to_pylist()}


RUN = changes(("new", "added", fp(9)), ("edited-done", "edited", fp(10)), ("edited-half", "edited", fp(11)),
              ("partial", "resumed", None), ("target", "resumed", None), ("new", "added", fp(9)))


def test_each_document_gets_its_next_version():
    d = decide(RUN, PREVIOUS, pending(("edited-half", 0), ("edited-half", 0), ("partial", 3)),
               pa.array(["gone"]), read_input=True)
    assert entries(d) == {
        "new": (fp(9), None, None),                    # added, complete: served
        "edited-done": (fp(10), None, None),           # edited, complete: the new version served
        "edited-half": (fp(2), fp(11), [0]),           # edited, not complete: the old one still served
        "partial": (fp(3), None, [3]),                 # resumed, still a chunk to go
        "target": (fp(5), None, None)}                 # the new version completed: promoted
    assert ids(d.gone) == ["edited-done", "edited-half", "gone", "new", "partial", "target"]


def test_the_rows_that_leave_or_move():
    d = decide(RUN, PREVIOUS, pending(("edited-half", 0), ("partial", 3)), pa.array(["gone"]), read_input=True)
    served, staged, this_run = d.rules[SERVED], d.rules[STAGED], d.rules[THIS_RUN]
    # the old version leaves once the new one is complete; a half-done edit keeps it
    assert ids(served.drop_docs) == ["edited-done", "gone", "target"]
    # a resumed document split again from the input: its pending chunks' earlier rows are redone
    assert ids(served.drop_keys) == ["partial\x002", "partial\x003"]
    assert not served.drop_null_ids and d.rules[FAILED].drop_null_ids   # rows without an id come again
    assert ids(d.rules[FAILED].drop_docs) == ids(served.drop_docs)
    assert ids(d.rules[PENDING].drop_docs) == ["edited-done", "edited-half", "gone", "new", "partial", "target"]
    assert ids(staged.drop_docs) == ["edited-done", "edited-half", "gone"]   # older unfinished versions
    assert ids(staged.drop_keys) == ["target\x001"]
    assert ids(staged.move_docs) == ["target"]           # promoted to the served files
    assert ids(this_run.move_docs) == ["edited-half"]    # staged until complete


def test_an_edit_of_a_version_served_as_far_as_it_went_replaces_it():
    """A version that was itself not complete is not kept beside the new one: the new one is
    served as far as it goes, the old rows and pending rows leave."""
    d = decide(changes(("partial", "edited", fp(12))), PREVIOUS, pending(("partial", 0)), pa.array([], pa.string()),
               read_input=True)
    assert entries(d) == {"partial": (fp(12), None, [0])}
    assert ids(d.rules[SERVED].drop_docs) == ["partial"] and ids(d.rules[PENDING].drop_docs) == ["partial"]
    assert ids(d.rules[THIS_RUN].move_docs) == []


def test_resumed_from_pending_rows_keeps_the_rows_of_earlier_pieces():
    """--resume without --input sends exactly the pending rows: nothing else of the document
    is done again, and rows without an id stay."""
    d = decide(changes(("partial", "resumed", None)), PREVIOUS, pending(), pa.array([], pa.string()),
               read_input=False)
    assert ids(d.rules[SERVED].drop_keys) == [] and not d.rules[FAILED].drop_null_ids
    assert entries(d) == {"partial": (fp(3), None, None)}


def test_a_resumed_document_dir_does_not_hold_is_refused():
    try:
        decide(changes(("stranger", "resumed", None)), PREVIOUS, pending(), pa.array([], pa.string()), True)
    except ValueError as exc:
        assert "resumed" in str(exc)
    else:
        raise AssertionError("expected a ValueError")


def test_a_file_is_split_into_the_rows_that_stay_and_those_that_move(tmp_path):
    source = tmp_path / "embeddings-r1-00000-of-00001.parquet"
    table = pa.table({"doc_id": ["a", "a", "b", "c", None], "chunk_index": pa.array([0, 1, 0, 0, None], pa.int32()),
                      "embedding": pa.array([[1.0, 2.0]] * 5, pa.list_(pa.float32(), 2))})
    pq.write_table(table, source, row_group_size=2)
    rules = Rules(drop_docs=pa.array(["c"]), drop_keys=pa.array(["a\x001"]), move_docs=pa.array(["b", "c"]),
                  drop_null_ids=True)
    assert count(str(source), rules) == (5, 3, 1)
    stays, moves = tmp_path / "stays.parquet", tmp_path / "moves.parquet"
    split_file(Task(str(source), "r", str(stays), str(moves)), rules, Codec())
    assert pq.read_table(stays).select(["doc_id", "chunk_index"]).to_pylist() == [{"doc_id": "a", "chunk_index": 0}]
    assert pq.read_table(moves).column("doc_id").to_pylist() == ["b"]
    assert pq.read_schema(stays).names == table.column_names
    assert count(str(source), Rules()) == (5, 0, 0)

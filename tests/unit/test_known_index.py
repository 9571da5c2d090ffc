"""KnownIndex (the streaming reuse of earlier vectors) decides as AntiJoinKnown does, from real
embeddings files and journal entries, and reads a vector only when it is asked for."""
from __future__ import annotations

import collections
import datetime as dt
import hashlib

import numpy as np
import pyarrow.parquet as pq

from transforms import schemas
from transforms.dedupe import known
from transforms.dedupe.known import KnownIndex, best_ref, read_vectors
from transforms.money import journal
from transforms.money.lineage import embeddings_table
from transforms.records import ChunkRef, TextItem

DIMS = 4
MODEL = "m"


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def item(text: str, doc: str) -> TextItem:
    return TextItem(sha(text), text, 3, (ChunkRef(doc, 0, 1, 0, 3, 3, ()),))


def write_embeddings(path, texts, request_id, model=MODEL, dims=DIMS, row_group_size=None):
    schema = schemas.embeddings(dims, [], schemas.metadata(model, dims, "old-run"))
    items = [item(t, f"doc-{t}") for t in texts]
    vectors = np.arange(len(texts) * dims, dtype=np.float32).reshape(len(texts), dims) + 100 * len(request_id)
    table = embeddings_table(items, vectors, [request_id] * len(items), [7] * len(items), schema, model,
                             "old-run", [], dt.datetime.now(dt.UTC))
    pq.write_table(table, path, row_group_size=row_group_size)
    return vectors


def write_journal(out, texts, request_id, shares):
    vectors = np.full((len(texts), DIMS), 0.5, dtype=np.float32) + np.arange(len(texts))[:, None]
    row = {"request_id": request_id, "model": MODEL, "started_at": "2026-11-23T00:00:00+00:00"}
    path = journal.write_entry(str(out), "killed-run", row, [sha(t) for t in texts], [3] * len(texts), vectors, shares)
    return path, vectors


def test_texts_in_earlier_outputs_are_found_with_their_request_and_vector(tmp_path):
    vectors = write_embeddings(tmp_path / "embeddings-a.parquet", ["x", "y", "z"], "req-a", row_group_size=2)
    write_embeddings(tmp_path / "embeddings-other.parquet", ["w"], "req-b", model="other-model")
    write_embeddings(tmp_path / "embeddings-short.parquet", ["v"], "req-c", dims=DIMS - 1)
    index = KnownIndex(MODEL, DIMS, sorted(map(str, tmp_path.glob("embeddings-*.parquet"))), [])
    for i, text in enumerate(["x", "y", "z"]):
        ref = index.lookup(sha(text))
        assert (ref.request_id, ref.share_micro) == ("req-a", 0)
        assert read_vectors(ref.path, ref.row_group, ref.journaled)[ref.row].tolist() == vectors[i].tolist()
    assert index.lookup(sha("w")) is None   # another model's vector is never this model's answer
    assert index.lookup(sha("v")) is None   # nor a vector of another length
    assert index.lookup(sha("never")) is None


def test_a_journaled_text_carries_its_share_unless_dir_already_holds_it_under_that_request(tmp_path):
    out = tmp_path / "out"
    path, vectors = write_journal(out, ["paid", "also-written"], "req-j", [11, 22])
    write_embeddings(tmp_path / "embeddings-dir.parquet", ["also-written", "elsewhere"], "req-j")
    index = KnownIndex(MODEL, DIMS, sorted(map(str, tmp_path.glob("embeddings-*.parquet"))), [path])
    paid = index.lookup(sha("paid"))
    assert (paid.request_id, paid.share_micro) == ("req-j", 11)
    assert read_vectors(paid.path, paid.row_group, paid.journaled)[paid.row].tolist() == vectors[0].tolist()
    written = index.lookup(sha("also-written"))
    assert (written.request_id, written.share_micro) == ("req-j", 0)


def test_of_two_journal_entries_the_larger_share_wins(tmp_path):
    out = tmp_path / "out"
    small, _ = write_journal(out, ["t"], "req-1", [5])
    large, _ = write_journal(out, ["t"], "req-2", [9])
    for paths in ([small, large], [large, small]):
        ref = KnownIndex(MODEL, DIMS, [], paths).lookup(sha("t"))
        assert (ref.request_id, ref.share_micro) == ("req-2", 9)


def test_the_join_and_the_index_choose_the_same_place(tmp_path):
    """best_ref (several workers, a join) decides as the KnownIndex (one process) does."""
    out = tmp_path / "out"
    path, _ = write_journal(out, ["paid", "also-written"], "req-j", [11, 22])
    write_embeddings(tmp_path / "embeddings-dir.parquet", ["also-written", "elsewhere"], "req-j")
    files = sorted(map(str, tmp_path.glob("embeddings-*.parquet")))
    index = KnownIndex(MODEL, DIMS, files, [path])
    refs = collections.defaultdict(list)
    for found in [*known._journal_refs(path), *(r for f in files for r in known._stored_refs(f, MODEL, DIMS))]:
        refs[found[0]].append(found[1])
    for text in ("paid", "also-written", "elsewhere"):
        chosen = best_ref(refs[sha(text)])
        assert (chosen.request_id, chosen.share_micro) == (index.lookup(sha(text)).request_id,
                                                            index.lookup(sha(text)).share_micro)

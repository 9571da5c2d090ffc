"""Which documents a run works on (transforms/read/changes.py), without Beam."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from transforms.read.changes import (ADDED, DOCINDEX, EDITED, RESUMED, REWRITTEN, UNCHANGED, Chunking, DocIndex,
                                     Entry, classify, counts, fingerprint, signature)

CHUNKS = Chunking(512, 0, 0.1)
SIG = signature("cl100k_base", CHUNKS, ("lang",), False)   # rows without their text: as every view had before
TEXT_SIG = signature("cl100k_base", CHUNKS, ("lang",), True)
OLD, NEW, OTHER = (fingerprint(SIG, text) for text in ("old text", "new text", "other text"))


@pytest.mark.parametrize("entry, fp, expected", [
    (None, NEW, (ADDED, None)),
    (Entry(OLD, None, None), OLD, (UNCHANGED, ())),
    (Entry(OLD, None, None), NEW, (EDITED, None)),
    (Entry(OLD, None, (2, 3)), OLD, (RESUMED, (2, 3))),          # served as far as it went
    (Entry(OLD, None, (2, 3)), NEW, (EDITED, None)),
    (Entry(OLD, NEW, (1,)), NEW, (RESUMED, (1,))),                # the new version being built
    (Entry(OLD, NEW, (1,)), OTHER, (EDITED, None)),               # edited again before it was done
    (Entry(OLD, NEW, (1,)), OLD, (EDITED, None)),                 # edited back: done again, all reused
], ids=["added", "unchanged", "edited", "resumed", "edited-while-incomplete", "resumed-target",
        "edited-again", "edited-back"])
def test_classify(entry, fp, expected):
    assert classify(entry, fp) == expected


def test_a_version_is_its_text_kept_values_and_what_shapes_its_chunks():
    assert fingerprint(SIG, "t", ("en",)) == fingerprint(SIG, "t", ("en",))
    assert fingerprint(SIG, "t", ("en",)) != fingerprint(SIG, "t", ("ru",))
    assert fingerprint(SIG, "t") != fingerprint(signature("cl100k_base", Chunking(256, 0, 0.1), ("lang",), False), "t")
    assert fingerprint(SIG, "t") != fingerprint(signature("cl100k_base", Chunking(512, 8, 0.1), ("lang",), False), "t")
    assert fingerprint(SIG, "t") != fingerprint(signature("cl100k_base", Chunking(512, 0, 0.2), ("lang",), False), "t")
    assert fingerprint(SIG, "t") != fingerprint(signature("cl100k_base", CHUNKS, (), False), "t")
    assert fingerprint(SIG, "t") != fingerprint(TEXT_SIG, "t")   # rows with their text are other rows
    assert fingerprint(SIG, None) != fingerprint(SIG, "")   # a null text is not an empty one
    assert fingerprint(SIG, None, (), "duplicate:2") != fingerprint(SIG, None, (), "duplicate:3")
    assert len(fingerprint(SIG, "t")) == 16


def test_a_document_served_without_its_text_is_rewritten_not_edited():
    """A view written without the text column (before rows carried it): the document DIR
    serves, complete, is read again under the signature with text, and only its rows change."""
    served = fingerprint(SIG, "t", ("en",))
    now, other = fingerprint(TEXT_SIG, "t", ("en",)), fingerprint(SIG, "t", ("en",))
    assert classify(Entry(served, None, None), now, other) == (REWRITTEN, None)
    edited = fingerprint(SIG, "t2", ("en",))
    assert classify(Entry(served, None, None), fingerprint(TEXT_SIG, "t2", ("en",)), edited) == (EDITED, None)
    # served as far as it went: its version is being built, so it is done again whole
    assert classify(Entry(served, None, (1,)), now, other) == (EDITED, None)
    assert counts({REWRITTEN: 3, EDITED: 1}, 10, 0) == {"added": 0, "edited": 1, "removed": 0, "unchanged": 9,
                                                       "resumed": 0, "rewritten": 3}
    assert "rewritten" not in counts({}, 10, 0)


def test_a_version_stays_the_same_across_releases():
    """DIR's document index keeps these: a new value for the same document would re-embed
    every document of a view at the next --sync."""
    assert fingerprint(SIG, "h\u00e9llo \udc80 w\u00f6rld", ("en", 1)).hex() == "e77c15d275c2813621d4d6cd8b1cd466"
    assert fingerprint(SIG, None).hex() == "a830b8d57c865b1c4a21804c2c7f4a10"
    assert fingerprint(SIG, None, (), "duplicate:2").hex() == "1e8b5d3e99d34c098e5078d7bb124662"


def test_the_document_index_round_trips_through_parquet(tmp_path):
    rows = [{"doc_id": "a", "served": OLD, "target": None, "todo": None},
            {"doc_id": "b", "served": OLD, "target": NEW, "todo": [1, 4]},
            {"doc_id": "c" * 70_000, "served": NEW, "target": None, "todo": [0]}]
    pq.write_table(pa.Table.from_pylist(rows, schema=DOCINDEX), tmp_path / "docindex.parquet")
    index = DocIndex(str(tmp_path / "docindex.parquet"))
    assert len(index) == 3
    assert index.get("a") == Entry(OLD, None, None)
    assert index.get("b") == Entry(OLD, NEW, (1, 4))
    assert index.get("c" * 70_000) == Entry(NEW, None, (0,))
    assert index.get("d") is None
    assert len(DocIndex(None)) == 0

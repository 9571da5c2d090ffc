"""Late copies (pipeline/outdir/late.py): a row whose text was sent before it came gets a copy of
what became of the text's first row, read back from this run's files."""
from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.outdir import OutputDir
from pipeline.outdir.late import write_late_copies
from transforms.dedupe.distinct import LateRef
from transforms.records import ChunkRef
from transforms.write.transform import Codec

RUN = "r1"


def _write(path, rows: dict):
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), path)


def _late(doc, index, start, end, first):
    return LateRef(ChunkRef(doc, index, 4, start, end, end - start, ()), "sha", first)


def test_a_late_piece_copies_only_the_rows_of_its_own_text(tmp_path):
    """Chunk 3 of A and of B (the same text) was re-split by an earlier run, which delivered
    its first piece and left two pending; resumed, each piece is a text of its own. B's second
    piece came late: it copies A's second piece and not A's third, which B gets on its own."""
    _write(tmp_path / "history" / RUN / f"embeddings-{RUN}-00000-of-00001.parquet", {
        "doc_id": ["A", "A", "B"], "chunk_index": [3, 3, 3], "chunk_count": [4, 4, 4],
        "token_start": [100, 150, 1150], "token_end": [150, 200, 1200],
        "request_id": ["q1", "q2", "q2"], "cost_rub": [0.5, 0.25, 0.25]})
    _write(tmp_path / "history" / RUN / f"failed-{RUN}-00000-of-00001.parquet", {
        "doc_id": ["A", "A"], "chunk_index": [3, 3], "reason": ["r", "r"], "detail": ["d", "d"]})
    late = [_late("B", 3, 1100, 1150, ("A", 3, 100, 150))]
    assert write_late_copies(OutputDir(str(tmp_path)), RUN, late, [], Codec()) == 2
    copies = pq.read_table(tmp_path / "history" / RUN / f"embeddings-{RUN}-late-00000-of-00001.parquet").to_pylist()
    assert copies == [{"doc_id": "B", "chunk_index": 3, "chunk_count": 4, "token_start": 1100,
                       "token_end": 1150, "request_id": "q1", "cost_rub": 0.0}]
    failed = pq.read_table(tmp_path / "history" / RUN / f"failed-{RUN}-late-00000-of-00001.parquet").to_pylist()
    assert failed == [{"doc_id": "B", "chunk_index": 3, "reason": "r", "detail": "d"}]


def test_a_late_chunk_copies_every_piece_its_text_was_split_into(tmp_path):
    """The first row's text came back too long and was split inside Embed: two rows, one text."""
    _write(tmp_path / "history" / RUN / f"embeddings-{RUN}-00000-of-00001.parquet", {
        "doc_id": ["A", "A", "C"], "chunk_index": [0, 0, 0], "chunk_count": [1, 1, 1],
        "token_start": [0, 40, 0], "token_end": [40, 90, 90],
        "request_id": ["q1", "q2", "q1"], "cost_rub": [0.1, 0.2, 0.3]})
    late = [_late("B", 0, 10, 100, ("A", 0, 0, 90))]
    assert write_late_copies(OutputDir(str(tmp_path)), RUN, late, [], Codec()) == 2
    copies = pq.read_table(tmp_path / "history" / RUN / f"embeddings-{RUN}-late-00000-of-00001.parquet")
    assert copies.select(["doc_id", "token_start", "token_end", "request_id", "cost_rub"]).to_pylist() == [
        {"doc_id": "B", "token_start": 10, "token_end": 50, "request_id": "q1", "cost_rub": 0.0},
        {"doc_id": "B", "token_start": 50, "token_end": 100, "request_id": "q2", "cost_rub": 0.0}]

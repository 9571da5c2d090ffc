"""The journal takes an answer's space before its request leaves (a real tmpfs, filled): a full
disk refuses the reservation, with nothing left behind, and an answer whose space was taken is
journaled whole however full the disk is by then."""
from __future__ import annotations

import errno
import os

import numpy as np
import pytest

from tests.conftest import fill
from transforms.money import journal

DIMS = 256


def row(request_id: str) -> dict:
    return {"request_id": request_id, "model": "m", "n_inputs": 3, "prompt_tokens": 30, "total_tokens": 30,
            "cost_rub": 0.000003, "balance_after": 9.99, "attempts": 1, "latency_ms": 5, "status": 200,
            "started_at": "2026-01-01T00:00:00+00:00", "run_id": "run-1"}


def answer(out: str, request_id: str, rows: int = 3) -> str:
    vectors = np.arange(rows * DIMS, dtype="<f4").reshape(rows, DIMS)
    return journal.write_entry(out, "run-1", row(request_id), [f"{i:064x}" for i in range(rows)], [10] * rows,
                               vectors, [1] * rows)


def test_an_answer_whose_space_was_taken_is_journaled_on_a_full_disk(small_disk):
    out = str(small_disk / "out")
    journal.reserve(out, "run-1", "r1", journal.entry_bytes(3, DIMS))
    journal.reserve(out, "run-1", "r2", journal.entry_bytes(3, DIMS))
    fill(small_disk, 0)
    with pytest.raises(OSError) as refused:   # the next request is not sent: no space for its answer
        journal.reserve(out, "run-1", "r3", journal.entry_bytes(3, DIMS))
    assert refused.value.errno == errno.ENOSPC
    path = answer(out, "r1")
    _, shas, _, vectors = journal.read_entry(out, "run-1", "r1")
    assert shas == [f"{i:064x}" for i in range(3)] and vectors.tolist() == np.arange(3 * DIMS).reshape(3, DIMS).tolist()
    assert os.path.getsize(path) <= journal.entry_bytes(3, DIMS)
    journal.release(out, "run-1", ["r1", "r2", "r3"])   # r2 got no answer: its space goes back
    assert sorted(os.listdir(journal.journal_dir(out, "run-1"))) == ["r1.parquet"]


def test_the_bound_holds_for_large_entries(tmp_path):
    for rows, dims in ((1, 1), (64, 1536), (2048, 3072)):
        vectors = np.zeros((rows, dims), "<f4")
        path = journal.write_entry(str(tmp_path), "run-1", {**row(f"r{rows}"), "n_inputs": rows},
                                   ["f" * 64] * rows, [8191] * rows, vectors, [123456] * rows)
        assert os.path.getsize(path) <= journal.entry_bytes(rows, dims)

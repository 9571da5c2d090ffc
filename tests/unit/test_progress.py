"""The whole job's progress: each worker process reports its counts to a file; the driver sums."""
from __future__ import annotations

from transforms.worker import progress
from transforms.worker.progress import Counts, Progress


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_reports_of_every_process_are_summed_and_discarded(tmp_path):
    clock = Clock()
    a = Progress(str(tmp_path), "run-1", interval_s=5, clock=clock)
    b = Progress(str(tmp_path), "run-1", interval_s=5, clock=clock)
    a.add(documents=10)
    assert progress.read_counts(str(tmp_path), "run-1") == Counts()  # not yet: the interval
    clock.now = 6
    a.add(documents=5, chunks=3, tokens=300, requests=1, cost_micro=1500)
    b.add(documents=7)  # b's own interval has passed too
    assert progress.read_counts(str(tmp_path), "run-1") == Counts(22, 3, 300, 1, 1500)
    b.add(chunks=2)
    b.flush()
    assert progress.read_counts(str(tmp_path), "run-1").chunks == 5
    progress.discard(str(tmp_path), "run-1")
    assert not (tmp_path / progress.PROGRESS_DIR).exists()
    assert progress.read_counts(str(tmp_path), "run-1") == Counts()


def test_the_line_has_rate_and_eta():
    line = progress.line(Counts(500, 480, 50_000, 5, 1_000_000), total_documents=2000, elapsed_s=10)
    assert "read 500/2000 documents (25%)" in line and "1.000000 RUB" in line
    assert "50 documents/s" in line and "ETA 30s" in line
    assert "ETA ?" in progress.line(Counts(), total_documents=0, elapsed_s=1)

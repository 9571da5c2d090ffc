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
    a.add(documents=10)   # the first change: written at once
    assert progress.read_counts(str(tmp_path), "run-1") == Counts(documents=10)
    a.add(documents=2)
    assert progress.read_counts(str(tmp_path), "run-1") == Counts(documents=10)   # not yet: the interval
    clock.now = 6
    a.add(documents=3, planned=2, answered=1, chunks=3, tokens=300, requests=1, cost_micro=1500)
    b.add(documents=7)
    assert progress.read_counts(str(tmp_path), "run-1") == Counts(22, 2, 1, 3, 300, 1, 1500)
    b.add(chunks=2)
    b.flush()
    assert progress.read_counts(str(tmp_path), "run-1").chunks == 5
    progress.discard(str(tmp_path), "run-1")
    assert not (tmp_path / progress.PROGRESS_DIR).exists()
    assert progress.read_counts(str(tmp_path), "run-1") == Counts()


def test_the_share_done_is_the_requests_answered_of_the_documents_read():
    assert progress.done(Counts(), total_documents=2000) == 0
    # a quarter read, half of its requests answered: an eighth of the job
    assert progress.done(Counts(documents=500, planned=40, answered=20), total_documents=2000) == 0.125
    assert progress.done(Counts(documents=2000, planned=40, answered=40), total_documents=2000) == 1
    assert progress.done(Counts(documents=2000), total_documents=2000) == 1   # nothing changed: nothing to send
    assert progress.done(Counts(planned=4, answered=1), total_documents=0) == 0.25   # documents not counted


def test_the_line_has_the_share_and_eta():
    line = progress.line(Counts(500, 40, 20, 480, 50_000, 21, 1_000_000), total_documents=2000, elapsed_s=10)
    assert "read 500/2000 documents, answered 20/40 requests (12%)" in line and "1.000000 RUB" in line
    assert "ETA 70s" in line
    assert "ETA ?" in progress.line(Counts(), total_documents=2000, elapsed_s=1)


def test_where_texts_are_grouped_first_the_line_counts_without_a_share_or_eta():
    line = progress.line(Counts(2000, 40, 20, 480, 50_000, 21, 1_000_000), total_documents=2000, elapsed_s=10,
                         paced=False)
    assert "read 2000/2000 documents, answered 20 requests, embedded 480 chunks" in line
    assert "%" not in line and "ETA" not in line


def test_a_progress_interval_of_0_is_refused_in_the_settings(tmp_path):
    """The driver's poll waits that long between reads: 0 would spin a core."""
    import pytest

    from pipeline.settings.steps import run_settings
    from service.catalog import ConfigError
    for name in ("progress_interval_s", "progress_redraw_s"):
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"embed:\n  {name}: 0\n")
        with pytest.raises(ConfigError, match=f"embed.{name} must be > 0"):
            run_settings(str(path))

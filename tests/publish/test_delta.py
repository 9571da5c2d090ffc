"""A publish after each kind of run writes about as many rows as changed, and the table is
the view after it, bit for bit; a table edited by hand is repaired by the next publish."""
from __future__ import annotations

import pytest

from tests.e2e.money_helpers import corpus_rows
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, published, tuples_written, view_rows


def changed_keys(before: dict, after: dict) -> int:
    """Rows that differ between two views: written, replaced or removed."""
    return sum(1 for k in after if k not in before or before[k] != after[k]) + sum(1 for k in before if k not in after)


@pytest.mark.parametrize("launcher_rows", [10_000, 0])   # the delta's rows loaded by the launcher, or the workers
def test_a_sync_day_writes_the_change_not_the_corpus(days, pg_url, capsys, tmp_path, launcher_rows):
    config = tmp_path / "pipeline.yaml"
    config.write_text(f"publish:\n  launcher_rows: {launcher_rows}\n")
    rows = corpus_rows(n_short=60, n_long=3)
    assert days(rows) == 0
    first = published(capsys, days.out, pg_url)
    assert first["action"] == "built"
    before = view_rows(days.out)
    rows2, _ = next_day(rows, edit_short=3, edit_long=1, remove=2, add=3)
    assert days(rows2, "--sync") == 0
    second = published(capsys, days.out, pg_url, "--run-config", str(config))
    after = assert_same(days.out, pg_url) and view_rows(days.out)
    assert second["action"] == "delta" and second["loaded_by"] == ("launcher" if launcher_rows else "workers")
    assert second["written"] == changed_keys(before, after) < len(after) / 4
    assert second["deleted"] >= 2 and second["inserted"] >= 3
    assert published(capsys, days.out, pg_url)["written"] == 0


@pytest.mark.parametrize("days", [32, 1024], indirect=True)   # vectors in the row, and TOASTed out of it
def test_day_2_writes_exactly_the_rows_that_changed(days, pg_url, capsys, tmp_path):
    """Changed: a key the view gained or lost, or whose row differs from the served one in any
    column (the vector's bytes included). Each takes one tuple write of the data table (an
    update in place where the key stays); a row whose vector and text stayed is updated without
    a new entry in any index (HOT) where its page has room (a row with its text and tsvector
    takes up to ~2.5 kB here: pages loaded half full leave it)."""
    config = tmp_path / "pipeline.yaml"
    config.write_text("publish:\n  fillfactor: 50\n")
    rows = corpus_rows(n_short=60, n_long=3)
    assert days(rows) == 0
    assert published(capsys, days.out, pg_url, "--run-config", str(config))["action"] == "built"
    first, before = tuples_written(pg_url), view_rows(days.out)
    assert first["inserted"] == len(before)
    rows2, _ = next_day(rows, edit_short=3, edit_long=2, remove=2, add=3)
    assert days(rows2, "--sync") == 0
    report = published(capsys, days.out, pg_url, "--run-config", str(config))
    after = view_rows(days.out)
    assert_same(days.out, pg_url)
    second = tuples_written(pg_url)
    assert second["table"] == first["table"]
    took = {k: second[k] - first[k] for k in ("inserted", "updated", "hot", "deleted")}
    kept = [k for k in after if k in before and before[k] != after[k]]
    same_vector = [k for k in kept if before[k]["embedding"] == after[k]["embedding"]
                   and before[k]["text"] == after[k]["text"]]
    assert took["inserted"] == len(after.keys() - before.keys()) == report["inserted"] >= 3
    assert took["deleted"] == len(before.keys() - after.keys()) == report["deleted"] >= 2
    assert took["updated"] == len(kept) == report["updated"] > 0
    assert same_vector and took["hot"] == len(same_vector), (took, len(same_vector))

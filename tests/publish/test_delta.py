"""A publish after each kind of run writes about as many rows as changed, and the table is
the view after it, bit for bit; a table edited by hand is repaired by the next publish."""
from __future__ import annotations

from tests.e2e.money_helpers import corpus_rows
from tests.e2e.test_sync import next_day
from tests.publish.helpers import assert_same, published, view_rows


def changed_keys(before: dict, after: dict) -> int:
    """Rows that differ between two views: written, replaced or removed."""
    return sum(1 for k in after if k not in before or before[k] != after[k]) + sum(1 for k in before if k not in after)


def test_a_sync_day_writes_the_change_not_the_corpus(days, pg_url, capsys):
    rows = corpus_rows(n_short=60, n_long=3)
    assert days(rows) == 0
    first = published(capsys, days.out, pg_url)
    assert first["action"] == "built"
    before = view_rows(days.out)
    rows2, _ = next_day(rows, edit_short=3, edit_long=1, remove=2, add=3)
    assert days(rows2, "--sync") == 0
    second = published(capsys, days.out, pg_url)
    after = assert_same(days.out, pg_url) and view_rows(days.out)
    assert second["action"] == "delta"
    assert second["written"] == changed_keys(before, after) < len(after) / 4
    assert second["deleted"] >= 2 and second["inserted"] >= 3
    assert published(capsys, days.out, pg_url)["written"] == 0

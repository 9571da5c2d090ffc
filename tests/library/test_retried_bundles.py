"""A bundle that fails and is retried in the same worker process (Dataflow retries a batch
bundle up to 4 times; the FnApiRunner never does, so the stage is driven as the SDK harness
drives it: tests/library/bundles.py): the retry starts clean. Its rows are embedded, not
`duplicate_id`; rows that join a text's claim during the retry leave with its request; what
the failed attempt paid for is taken from the store, not paid again."""
from __future__ import annotations


import pytest

from tests.conftest import SANDBOX_KEY
from tests.library.bundles import Processor, library_fns, paid_texts, rows_of, text_sha


@pytest.fixture(autouse=True)
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


SHARED, OTHER = "a text three rows share", "a text of its own"
ROWS = [{"id": "a", "text": SHARED}, {"id": "b", "text": SHARED}, {"id": "c", "text": SHARED},
        {"id": "d", "text": OTHER}]


@pytest.mark.parametrize("store", [None, "store"])
def test_a_retried_bundle_reads_its_rows_again_and_every_row_of_a_claim_leaves_with_it(sandbox, tmp_path, store):
    """The first attempt claims SHARED for a and b and fails before the request leaves; the
    retry reads a, b and c (which the first attempt never reached) and d."""
    fns, _ = library_fns(sandbox.base_url, store and str(tmp_path / store))
    first = Processor(fns).bundle()
    first.push(ROWS[:2])
    first.fail()
    retry = Processor(fns).bundle()
    retry.push(ROWS)
    out = rows_of(retry.finish())
    assert sorted(out["embeddings"]) == [("a", 0), ("b", 0), ("c", 0), ("d", 0)]
    assert out["failed"] == [] and out["pending"] == []
    assert paid_texts(sandbox) == {text_sha(SHARED): 1, text_sha(OTHER): 1}


def test_what_a_failed_attempt_paid_for_is_taken_from_the_store(sandbox, tmp_path):
    """Requests of one input: the first attempt's request for SHARED leaves and is paid before
    the bundle fails; the retry takes its vector from the store."""
    fns, _ = library_fns(sandbox.base_url, str(tmp_path / "store"), max_inputs=1)
    first = Processor(fns).bundle()
    first.push(ROWS[:2])
    first.fail()
    assert paid_texts(sandbox) == {text_sha(SHARED): 1}
    retry = Processor(fns).bundle()
    retry.push(ROWS)
    out = rows_of(retry.finish())
    assert sorted(out["embeddings"]) == [("a", 0), ("b", 0), ("c", 0), ("d", 0)] and out["failed"] == []
    assert paid_texts(sandbox) == {text_sha(SHARED): 1, text_sha(OTHER): 1}


def test_a_bundle_that_succeeded_keeps_its_ids(sandbox, tmp_path):
    """The ids a finished bundle read stay the process's: a later bundle's row of one is a
    duplicate, on the same instances or on others."""
    fns, _ = library_fns(sandbox.base_url, None)
    processor = Processor(fns)
    done = processor.bundle()
    done.push(ROWS[:1])
    assert rows_of(done.finish())["embeddings"] == [("a", 0)]
    for later in (processor.bundle(), Processor(fns).bundle()):
        later.push([{"id": "a", "text": "another text of a"}])
        assert rows_of(later.finish())["failed"] == [("a", None, "duplicate_id")]

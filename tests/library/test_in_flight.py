"""A row whose text is in a request in flight waits for that request's settle, however long
the request takes, and every sealed request is settled, even one that never left; a request
leaves only once its answer has room in the store. EmbedTexts's stage driven as the SDK
harness drives it (tests/library/bundles.py), against the sandbox."""
from __future__ import annotations

import collections
import errno
import threading

import pytest
import yaml

from tests.conftest import SANDBOX_KEY, fill
from tests.library.bundles import Processor, library_fns, paid_texts, rows_of, text_sha
from tests.library.helpers import models_config


@pytest.fixture(autouse=True)
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def test_a_row_waits_for_a_request_that_outlasts_any_bound_of_one_request(sandbox_factory, tmp_path):
    """The client believes the model takes 20000 tokens, the sandbox 8191: the request's last
    input draws a 400, bisected down to it alone, then split; its 6 billed sub-requests take
    1 s each, one after another, longer than its retries, two timed-out attempts and its
    refusals could take (0.5 + 2 x 2 + 0.5 s): the row of its first text waits for all of them
    and takes the vector from the store, paid once."""
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--latency-ms", "1000"])
    models, settings = models_config(tmp_path, max_input_tokens=20000), tmp_path / "pipeline.yaml"
    settings.write_text(yaml.safe_dump({"client": {"max_total_s": 0.5, "read_timeout_s": 2.0,
                                                   "read_timeout_max_s": 2.0},
                                        "embed": {"max_refused_s": 0.5}}))
    rows = [{"id": f"d{i}", "text": f"text number {i}"} for i in range(31)] + [{"id": "long", "text": "word " * 9000}]
    fns, _ = library_fns(sb.base_url, str(tmp_path / "store"), models_config=models, run_config=str(settings),
                         max_inputs=32)
    bundle = Processor(fns).bundle()
    bundle.push(rows)                                   # 32 inputs: the request leaves
    bundle.push([{"id": "again", "text": "text number 0"}])   # waits for it
    out = rows_of(bundle.finish())
    embedded = collections.Counter(d for d, _ in out["embeddings"])   # the long text: in pieces
    assert embedded.keys() == {r["id"] for r in rows} | {"again"} and embedded["again"] == 1
    assert out["failed"] == [] and out["pending"] == []
    paid = paid_texts(sb)
    assert paid[text_sha("text number 0")] == 1 and max(paid.values()) == 1


def test_a_request_sealed_and_never_submitted_is_settled(sandbox, tmp_path):
    """The Embed step raises after sealing a request, before its pool takes it: the rows of
    another bundle that wait for its text go on at once, claim it and send it."""
    fns, _ = library_fns(sandbox.base_url, str(tmp_path / "store"), max_inputs=1)
    broken = Processor(fns)
    broken.fns[-1]._pool.shutdown()                     # its submit raises
    failing = broken.bundle()
    with pytest.raises(RuntimeError, match="shutdown"):
        failing.push([{"id": "a", "text": "a text"}])
    failing.fail()
    outs = []
    other = threading.Thread(target=lambda: outs.append(_one_bundle(fns, [{"id": "b", "text": "a text"}])), daemon=True)
    other.start()
    other.join(timeout=30)
    assert not other.is_alive(), "a row waits for a request that never left"
    assert outs[0]["embeddings"] == [("b", 0)] and paid_texts(sandbox) == {text_sha("a text"): 1}


def _one_bundle(fns, rows) -> dict:
    bundle = Processor(fns).bundle()
    bundle.push(rows)
    return rows_of(bundle.finish())


def test_a_local_store_takes_an_answers_space_before_its_request_leaves(sandbox, small_disk):
    """A store on a full disk: the request is not sent (nothing billed, no intent), as with
    DIR's journal; an answer paid for can never fail to be kept."""
    store = small_disk / "store"
    fns, _ = library_fns(sandbox.base_url, str(store), max_inputs=1)
    bundle = Processor(fns).bundle()
    fill(small_disk, 8192)   # room for an intent, not for an answer of 1536 floats
    with pytest.raises(OSError) as full:
        bundle.push([{"id": "a", "text": "a text"}])
        bundle.finish()
    bundle.fail()
    assert full.value.errno == errno.ENOSPC
    assert sandbox.ledger() == [] and not list(store.rglob("*.intent.json"))

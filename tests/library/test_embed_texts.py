"""embedpipe.EmbedTexts in a user's pipeline, against the sandbox over HTTP: every row ends in
exactly one of embeddings / failed / pending, costs reconcile with the ledger to the
micro-rouble, each distinct text is paid once, the budget stops spending, no key stops the
pipeline before it runs."""
from __future__ import annotations

from itertools import pairwise
import collections
import hashlib
import time

import apache_beam as beam
import numpy as np
import pytest
import yaml

import embedpipe
from service.credentials import MissingApiKeyError
from service.sandbox.store import read_ledger
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows
from tests.e2e.test_runners import job_endpoint  # noqa: F401  (the job service fixture)
from tests.library.helpers import MODEL, collected, micro, models_config, run_pipeline

KINDS = ("embeddings", "failed", "pending", "requests")
BAD = ["not a dict", 42, {"text": "a row without an id field"}, {"id": "no-text"}, {"id": "int-text", "text": 7},
       {"id": 3.5, "text": "a float id"}]


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _run(tmp_path, rows, sandbox, *argv, **kwargs):
    def build(p):
        result = p | beam.Create(rows, reshuffle=False) | embedpipe.EmbedTexts(MODEL, sandbox.base_url, **kwargs)
        return {kind: getattr(result, kind) for kind in KINDS}
    run_pipeline(build, tmp_path, *argv)
    return collected(tmp_path, *KINDS)


def test_every_row_ends_once_with_lineage_that_sums_to_the_bill(sandbox, key_env, tmp_path):
    rows = corpus_rows() + BAD
    out = _run(tmp_path, rows, sandbox)
    emb, failed = out["embeddings"], out["failed"]
    reasons = collections.Counter(f["reason"] for f in failed)
    assert reasons == {"null_text": 1, "empty_text": 2, "duplicate_id": 1, "null_id": 1, "not_a_dict": 2,
                       "missing_id": 1, "missing_text": 1, "not_text": 1, "bad_id": 1}
    assert all(f["detail"] and f["chunk_index"] is None for f in failed)
    assert out["pending"] == []
    embedded_ids = {r["doc_id"] for r in emb}
    failed_ids = {f["doc_id"] for f in failed if f["doc_id"] is not None}
    good = {r["id"] for r in corpus_rows() if r["id"] and r["text"] and r["text"].strip()}
    assert embedded_ids == good and failed_ids & embedded_ids == {"twice"}   # its first row is embedded
    assert {r["text_sha256"] for r in emb if r["doc_id"] == "twice"} == {_sha("first of two rows")}
    # chunks: one row each, complete, within the model's limit; long-1 was split
    by_doc = collections.defaultdict(list)
    for r in emb:
        by_doc[r["doc_id"]].append(r["chunk_index"])
        assert isinstance(r["embedding"], np.ndarray) and r["embedding"].dtype == np.float32
        assert r["embedding"].shape == (1536,) and r["n_tokens"] <= 8191
    assert all(sorted(ix) == list(range(len(ix))) for ix in by_doc.values())
    assert len(by_doc["long-1"]) > 1
    # money: rows sum to their requests, requests to the ledger; each text paid once
    ledger = sandbox.ledger()
    assert sum(micro(r["cost_rub"]) for r in emb) == sum(micro(r["cost_rub"]) for r in out["requests"]) \
        == sum(micro(c["cost_rub"]) for c in ledger) > 0
    paid = [sha for c in ledger for sha in c["input_sha256"]]
    assert len(paid) == len(set(paid)) == len({r["text_sha256"] for r in emb})
    first, copy = ([r for r in emb if r["doc_id"] == d][0] for d in ("en-0", "dup-text-a"))
    assert np.array_equal(first["embedding"], copy["embedding"]) and first["request_id"] == copy["request_id"]
    # each row carries the text sent for its vector: a slice of its document, in order
    texts = {r["id"]: r["text"] for r in corpus_rows() if r["id"] and r["id"] != "twice"}
    for doc_id in good - {"twice"}:
        passages = [r["text"] for r in sorted((r for r in emb if r["doc_id"] == doc_id), key=lambda r: r["chunk_index"])]
        assert "".join(passages) == texts[doc_id]
    assert all(_sha(r["text"]) == r["text_sha256"] for r in emb)


def test_the_budget_stops_spending_and_the_rest_is_pending(sandbox, key_env, tmp_path):
    rows = [{"id": f"d{i}", "text": f"document {i} " + "word " * 300} for i in range(40)]
    out = _run(tmp_path, rows, sandbox, max_spend_rub=0.01)
    spent = sum(micro(c["cost_rub"]) for c in sandbox.ledger())
    assert spent <= micro(0.01)
    assert out["pending"] and {p["reason"] for p in out["pending"]} == {"budget_exhausted"}
    assert all(p["text"] for p in out["pending"])
    ends = [r["doc_id"] for r in out["embeddings"]] + [p["doc_id"] for p in out["pending"]]
    assert sorted(ends) == sorted(r["id"] for r in rows) and out["failed"] == []
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == spent


def test_no_key_is_an_error_before_any_bundle_runs(sandbox, monkeypatch, tmp_path):
    monkeypatch.delenv("EMBEDDINGS_API_KEY", raising=False)
    p = beam.Pipeline()
    with pytest.raises(MissingApiKeyError, match="EMBEDDINGS_API_KEY"):
        p | beam.Create([{"id": "a", "text": "x"}]) | embedpipe.EmbedTexts(MODEL, sandbox.base_url)
    assert sandbox.ledger() == []


def test_a_key_file_and_a_named_variable_are_read_the_key_never_shown(sandbox, monkeypatch, tmp_path, caplog):
    monkeypatch.delenv("EMBEDDINGS_API_KEY", raising=False)
    key_file = tmp_path / "key"
    key_file.write_text(SANDBOX_KEY + "\n")
    out = _run(tmp_path, [{"id": "a", "text": "alpha"}], sandbox, api_key_file=str(key_file))
    assert [r["doc_id"] for r in out["embeddings"]] == ["a"]
    monkeypatch.setenv("MY_KEY", SANDBOX_KEY)
    out = _run(tmp_path, [{"doc": "b", "body": "beta"}], sandbox, api_key_env="MY_KEY", id_field="doc",
               text_field="body")
    assert [r["doc_id"] for r in out["embeddings"]] == ["b"]
    assert SANDBOX_KEY not in caplog.text
    assert all(SANDBOX_KEY not in repr(v) for kind in out.values() for v in kind)


@pytest.mark.soak   # slow: make soak
def test_the_portable_runner_gives_the_same_rows(sandbox, key_env, tmp_path, job_endpoint):  # noqa: F811
    """The path Flink and Dataflow take: a job service, the pipeline as a portable proto."""
    rows = corpus_rows() + BAD
    (tmp_path / "local").mkdir()
    local = _run(tmp_path / "local", rows, sandbox)
    before = len(sandbox.ledger())
    portable = _run(tmp_path, rows, sandbox, "--runner", "PortableRunner", "--job_endpoint", job_endpoint,
                    "--environment_type", "LOOPBACK")

    def rows_of(out):
        return sorted((r["doc_id"], r["chunk_index"], r["text_sha256"], r["embedding"].tobytes())
                      for r in out["embeddings"])
    assert rows_of(portable) == rows_of(local)
    assert sorted(map(repr, portable["failed"])) == sorted(map(repr, local["failed"]))
    charges = sandbox.ledger()[before:]
    assert sum(micro(r["cost_rub"]) for r in portable["embeddings"]) == sum(micro(c["cost_rub"]) for c in charges)


def test_transient_faults_are_retried_and_nothing_is_paid_twice(sandbox_factory, key_env, tmp_path):
    """The job's client retries 5xx (its one retry loop, uncharged attempts): every row is
    embedded, one charge a request, and the rows' costs sum to the ledger."""
    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"seed": 7, "rate_500": 0.15, "rate_503": 0.1}))
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=["--faults", str(faults)])
    models = models_config(tmp_path, max_inputs_per_request=4)   # 40 rows are 10 requests
    settings = tmp_path / "pipeline.yaml"
    settings.write_text(yaml.safe_dump({"client": {"initial_backoff_s": 0.01, "max_backoff_s": 0.05}}))
    rows = [{"id": f"d{i}", "text": f"document {i}"} for i in range(40)]

    def build(p):
        result = p | beam.Create(rows) | embedpipe.EmbedTexts(MODEL, sb.base_url, models_config=models,
                                                              run_config=str(settings))
        return {kind: getattr(result, kind) for kind in KINDS}
    result = run_pipeline(build, tmp_path)
    out = collected(tmp_path, *KINDS)
    found = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("embedpipe"))["counters"]
    counters = {c.key.metric.name: c.committed for c in found}
    assert sorted(r["doc_id"] for r in out["embeddings"]) == sorted(r["id"] for r in rows)
    assert counters["retries"] > 0 and len(out["requests"]) == 10
    ledger = sb.ledger()
    assert len(ledger) == 10 and sum(micro(c["cost_rub"]) for c in ledger) == \
        sum(micro(r["cost_rub"]) for r in out["embeddings"])


def test_a_repeated_ids_first_row_is_its_own_and_later_rows_fail_whatever_their_text(sandbox, key_env, tmp_path):
    rows = [{"id": "x", "text": "the first row of x"}, {"id": "x", "text": ""}, {"id": "y", "text": "shared"},
            {"id": "z", "text": "shared"}, {"id": "z", "text": "another text of z"}, {"id": "w", "text": ""},
            {"id": "w", "text": "a later row of w"}]
    out = _run(tmp_path, rows, sandbox)
    assert sorted((f["doc_id"], f["reason"]) for f in out["failed"]) == [
        ("w", "duplicate_id"), ("w", "empty_text"), ("x", "duplicate_id"), ("z", "duplicate_id")]
    assert sorted((r["doc_id"], r["text_sha256"]) for r in out["embeddings"]) == [
        ("x", _sha("the first row of x")), ("y", _sha("shared")), ("z", _sha("shared"))]
    assert sorted(sha for c in sandbox.ledger() for sha in c["input_sha256"]) == sorted(
        [_sha("the first row of x"), _sha("shared")])


def test_passages_sized_by_the_run_config_and_their_text_left_out_on_request(sandbox, key_env, tmp_path):
    config = tmp_path / "pipeline.yaml"
    config.write_text("split:\n  chunk_tokens: 16\n")
    rows = [{"id": "a", "text": "Each passage comes back with the text that was sent for it. " * 6}]
    emb = _run(tmp_path, rows, sandbox, run_config=str(config))["embeddings"]
    assert len(emb) > 3 and all(r["n_tokens"] <= 16 for r in emb)
    assert "".join(r["text"] for r in sorted(emb, key=lambda r: r["chunk_index"])) == rows[0]["text"]
    config.write_text("split:\n  chunk_tokens: 16\noutput:\n  chunk_text: false\n")
    assert all("text" not in r for r in _run(tmp_path, rows, sandbox, run_config=str(config))["embeddings"])


def test_a_text_the_service_finds_too_long_is_split_again(sandbox, key_env, tmp_path):
    """The client believes the model takes 20000 tokens, the sandbox 8191: the 9000-token chunk
    draws an over-length 400 and is re-split; its pieces keep its chunk_index, in token order."""
    rows = [{"id": "long", "text": "word " * 9000}, {"id": "short", "text": "a short one"}]
    out = _run(tmp_path, rows, sandbox, models_config=models_config(tmp_path, max_input_tokens=20000))
    pieces = sorted((r["token_start"], r["token_end"], r["chunk_index"]) for r in out["embeddings"]
                    if r["doc_id"] == "long")
    assert len(pieces) >= 2 and {p[2] for p in pieces} == {0} and pieces[0][0] == 0
    assert all(a[1] == b[0] for a, b in pairwise(pieces)) and all(e - s <= 8191 for s, e, _ in pieces)
    long = sorted((r for r in out["embeddings"] if r["doc_id"] == "long"), key=lambda r: r["token_start"])
    assert "".join(r["text"] for r in long) == rows[0]["text"]   # each piece's row carries the piece
    assert out["failed"] == [] and {r["doc_id"] for r in out["embeddings"]} == {"long", "short"}
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == sum(micro(c["cost_rub"]) for c in sandbox.ledger())


def test_two_local_worker_processes_pay_each_text_once(sandbox, key_env, tmp_path):
    rows = corpus_rows() + [{"id": f"copy-{i}", "text": "one text many rows"} for i in range(30)]
    out = _run(tmp_path, rows, sandbox, "--direct_num_workers", "2", "--direct_running_mode", "multi_processing")
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert len(paid) == len(set(paid)) == len({r["text_sha256"] for r in out["embeddings"]})
    copies = [r for r in out["embeddings"] if r["doc_id"].startswith("copy-")]
    assert len(copies) == 30 and len({r["request_id"] for r in copies}) == 1
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == sum(micro(c["cost_rub"]) for c in sandbox.ledger())


def test_a_text_that_comes_again_after_its_answer_is_not_paid_again(sandbox, key_env, tmp_path):
    """Without a store: the pipeline's own (a temporary directory) holds what it paid, so a
    repeat long after its text's request was answered takes the vector from there."""
    models = models_config(tmp_path, max_inputs_per_request=4)   # the repeat comes 10 requests later
    rows = ([{"id": "first", "text": "a text that comes again"}]
            + [{"id": f"d{i}", "text": f"filler document {i}"} for i in range(40)]
            + [{"id": "again", "text": "a text that comes again"}])
    out = _run(tmp_path, rows, sandbox, models_config=models)
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert len(paid) == len(set(paid)) == 41
    first, again = ([r for r in out["embeddings"] if r["doc_id"] == d][0] for d in ("first", "again"))
    assert np.array_equal(first["embedding"], again["embedding"]) and again["request_id"] == first["request_id"]
    assert sum(micro(r["cost_rub"]) for r in out["embeddings"]) == sum(micro(c["cost_rub"]) for c in sandbox.ledger())


def _rows_until_billed(seed, db: str, n: int):
    """N rows; after the first 300 (past ReadRows's batch of 256), none until the sandbox has
    billed a request: a step that waits for its whole input would never see the rest."""
    for i in range(n):
        if i == 300:
            deadline = time.monotonic() + 30
            while not list(read_ledger(db)) and time.monotonic() < deadline:
                time.sleep(0.05)
            yield {"id": "billed-before-the-rest", "text": str(bool(list(read_ledger(db))))}
        yield {"id": f"d{i}", "text": f"streamed document {i}"}


def test_the_first_request_leaves_before_the_input_ends(sandbox, key_env, tmp_path):
    models = models_config(tmp_path, max_inputs_per_request=4)   # 300 rows fill many requests

    def build(p):
        result = (p | beam.Create([None], reshuffle=False)
                  | beam.FlatMap(_rows_until_billed, str(sandbox.db), 600)
                  | embedpipe.EmbedTexts(MODEL, sandbox.base_url, models_config=models))
        return {kind: getattr(result, kind) for kind in KINDS}
    run_pipeline(build, tmp_path)
    out = collected(tmp_path, *KINDS)
    marker = hashlib.sha256(b"True").hexdigest()
    assert [r["text_sha256"] for r in out["embeddings"] if r["doc_id"] == "billed-before-the-rest"] == [marker]
    assert len(out["embeddings"]) == 601


def test_an_empty_input_spends_nothing(sandbox, key_env, tmp_path):
    assert _run(tmp_path, [], sandbox) == {kind: [] for kind in KINDS}
    assert sandbox.ledger() == []


def test_the_embeddings_and_a_users_batches_of_them_are_sized_by_the_row_coder(sandbox, key_env):
    """Beam sizes sampled elements by encoding them: rows of a vector and a datetime each are
    sized from their fields, in EmbedTexts's output and in a user's BatchElements after it."""
    from transforms.records import Row
    from transforms.worker.coders import RowCoder
    p = beam.Pipeline()
    rows = (p | beam.Create([{"id": "a", "text": "a text"}])
            | embedpipe.EmbedTexts(MODEL, sandbox.base_url)).embeddings
    batches = rows | beam.BatchElements(min_batch_size=10)
    assert rows.element_type is Row and isinstance(beam.coders.registry.get_coder(rows.element_type), RowCoder)
    batch_coder = beam.coders.registry.get_coder(batches.element_type)
    assert "RowCoder" in repr(batch_coder)

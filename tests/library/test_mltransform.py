"""embedpipe.ServiceTextEmbeddings in MLTransform, against the sandbox over HTTP: requests cut
by tokens within the model's caps, a 400 bisected (never retried), each ml.rag item's tokens and
cost in its metadata summing to the ledger, Beam counters, the key never in MLTransform's
artifacts; max_spend_rub stops spending with every row out; a text repeated across batches
paid once; a text over the limit given the token-weighted mean of its pieces (the CLI's
document vector); with a store (or a CLI DIR read as one), a second pipeline sends nothing."""
from __future__ import annotations

import hashlib
import math
import threading

import apache_beam as beam
import numpy as np
import pytest
import yaml
from apache_beam.ml.rag.types import Chunk, Content
from apache_beam.ml.transforms.base import MLTransform

import embedpipe
from embedpipe._config import resolve
from embedpipe.mltransform import _combined, _Service
from embedpipe.paid import Answer, PaidTexts
from embedpipe.rag import COST, ERROR, TOKENS
from service.catalog import load_models
from service.credentials import KeySource, MissingApiKeyError
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import corpus_rows, read_kind, run, write_corpus
from tests.library.bundles import paid_texts, text_sha
from tests.library.helpers import MODEL, collected, micro, models_config, run_pipeline
from transforms.write.docvectors import token_weighted_mean


@pytest.fixture
def key_env(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


def _counters(result) -> dict:
    found = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("embedpipe"))["counters"]
    return {c.key.metric.name: c.committed for c in found}


def _batches(result) -> int:
    """How many batches RunInference gave the handler (its own distribution, in our namespace)."""
    found = result.metrics().query(beam.metrics.MetricsFilter().with_namespace("embedpipe").with_name(
        "inference_request_batch_size"))["distributions"]
    return sum(d.committed.count for d in found)


def test_dicts_write_artifacts_without_the_key_and_read_them_back(sandbox, key_env, tmp_path):
    rows = [{"id": i, "text": f"sentence number {i % 40} about vectors"} for i in range(3000)]
    artifacts = tmp_path / "artifacts"

    def build(p):
        embedder = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url)
        return {"out": p | beam.Create(rows, reshuffle=False)
                | MLTransform(write_artifact_location=str(artifacts)).with_transform(embedder)}
    result = run_pipeline(build, tmp_path)
    out = collected(tmp_path, "out")["out"]
    assert len(out) == 3000 and all(r["text"].shape == (1536,) for r in out)
    assert [r["text_text"] for r in out] == [r["text"] for r in rows]   # the text paid for, beside its vector
    ledger = sandbox.ledger()
    # 40 distinct texts, one request a batch (Beam's OpenAI provider: 150 requests of 20)
    assert len(ledger) <= 2 and sum(len(c["input_sha256"]) for c in ledger) <= 80
    counters = _counters(result)
    assert counters["requests"] == len(ledger) and counters["retries"] == 0
    assert counters["cost_micro_rub"] == sum(micro(c["cost_rub"]) for c in ledger)
    files = [f for f in artifacts.rglob("*") if f.is_file()]
    assert files and not any(SANDBOX_KEY.encode() in f.read_bytes() for f in files)

    def read_back(p):
        return {"back": p | beam.Create(rows[:3]) | MLTransform(read_artifact_location=str(artifacts))}
    run_pipeline(read_back, tmp_path)
    back = collected(tmp_path, "back")["back"]
    assert [r["id"] for r in back] == [0, 1, 2] and all(r["text"].shape == (1536,) for r in back)


def test_rag_items_carry_tokens_and_cost_that_sum_to_the_ledger(sandbox, key_env, tmp_path):
    items = [Chunk(content=Content(text=f"chunk {i} " + "token " * (i % 50)), id=f"c{i}", metadata={"doc": i // 10})
             for i in range(200)] + [Chunk(content=Content(text=None), id="no-text")]

    def build(p):
        return {"items": p | beam.Create(items) | MLTransform(write_artifact_location=str(tmp_path / "a"))
                .with_transform(embedpipe.ServiceTextEmbeddings(model=MODEL, base_url=sandbox.base_url))}
    run_pipeline(build, tmp_path)
    out = {i.id: i for i in collected(tmp_path, "items")["items"]}
    assert out["no-text"].embedding is None and out["no-text"].metadata[ERROR] == "empty_text"
    done = [i for i in out.values() if i.id != "no-text"]
    assert all(len(i.embedding.dense_embedding) == 1536 and i.metadata[TOKENS] > 0 for i in done)
    assert sum(micro(i.metadata[COST]) for i in done) == sum(micro(c["cost_rub"]) for c in sandbox.ledger())


def test_a_400_is_bisected_never_retried_and_the_text_at_fault_split(sandbox, key_env, tmp_path):
    """The client believes the model takes 20000 tokens, the sandbox 8191: a 9000-token text
    draws a 400, which is bisected down to that text alone; the runner then splits it, as the
    job does, and it gets the token-weighted mean of its pieces."""
    spec = load_models()[MODEL]
    models = tmp_path / "models.yaml"
    fields = {k: getattr(spec, k) for k in ("tokenizer", "safety_factor", "max_inputs_per_request",
                                            "max_tokens_per_request", "dimensions", "supports_dimensions",
                                            "price_rub_per_1m_tokens")}
    models.write_text(yaml.safe_dump({"models": {MODEL: {**fields, "max_input_tokens": 20000}}}))
    rows = [{"id": i, "text": f"short text {i}"} for i in range(6)]
    rows.insert(3, {"id": 99, "text": "word " * 9000})

    def build(p):
        embedder = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url, models_config=str(models))
        return {"out": p | beam.Create(rows, reshuffle=False)
                | MLTransform(write_artifact_location=str(tmp_path / "a")).with_transform(embedder)}
    counters = _counters(run_pipeline(build, tmp_path))
    out = {r["id"]: r for r in collected(tmp_path, "out")["out"]}
    assert all(out[i]["text"].shape == (1536,) for i in [*range(6), 99])
    assert abs(np.linalg.norm(out[99]["text"]) - 1) < 1e-5
    assert counters["retries"] == 0 and counters["failed_texts"] == 0
    # 7 inputs: 400, then halves until the long one stands alone (at most 2 log2(7) + 1
    # requests), then its pieces (of at most half its tokens) in one
    assert 3 <= counters["requests"] <= 2 * math.ceil(math.log2(7)) + 2
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert len(paid) == len(set(paid)) >= 6 + 2


def test_no_key_is_an_error_before_any_bundle_runs(sandbox, monkeypatch, tmp_path):
    monkeypatch.delenv("EMBEDDINGS_API_KEY", raising=False)
    p = beam.Pipeline()
    embedder = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url)
    with pytest.raises(MissingApiKeyError, match="EMBEDDINGS_API_KEY"):
        p | beam.Create([{"text": "x"}]) | MLTransform(write_artifact_location=str(tmp_path / "a")).with_transform(
            embedder)
    assert sandbox.ledger() == []


def test_beam_rows_come_back_as_rows_with_exception_handling(sandbox, key_env, tmp_path):
    def build(p):
        rows = [beam.Row(id=1, text="a row"), beam.Row(id=2, text=None)]
        out, errors = (p | beam.Create(rows) | MLTransform(write_artifact_location=str(tmp_path / "a"))
                       .with_transform(embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url))
                       .with_exception_handling())
        return {"out": out, "errors": errors}
    run_pipeline(build, tmp_path)
    assert collected(tmp_path, "errors")["errors"] == []
    out = sorted(collected(tmp_path, "out")["out"], key=lambda r: r.id)
    assert [type(r) for r in out] == [beam.Row, beam.Row]
    assert out[0].text.shape == (1536,) and out[1].text is None and out[1].text_error == "empty_text"


def _embed_rows(tmp_path, rows, sandbox, *argv, **kwargs):
    def build(p):
        embedder = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url, **kwargs)
        return {"out": p | beam.Create(rows, reshuffle=bool(argv))
                | MLTransform(write_artifact_location=str(tmp_path / "a")).with_transform(embedder)}
    result = run_pipeline(build, tmp_path, *argv)
    return {r["id"]: r for r in collected(tmp_path, "out")["out"]}, _counters(result), result


TWO_PROCESSES = ("--direct_num_workers=2", "--direct_running_mode=multi_processing")


@pytest.mark.parametrize("argv", [(), TWO_PROCESSES], ids=["one-process", "two-processes"])
def test_the_cap_stops_spending_and_every_row_comes_out_with_a_vector_or_why_not(sandbox, key_env, tmp_path, argv):
    """One request in flight per process: one process never passes the cap; two overshoot it by
    at most the other's request in flight (docs/money.md, the overshoot bound)."""
    settings = tmp_path / "pipeline.yaml"
    settings.write_text(yaml.safe_dump({"embed": {"max_in_flight": 1, "initial_in_flight": 1}}))
    rows = [{"id": i, "text": f"document {i} " + "word " * 300} for i in range(40)]
    out, counters, result = _embed_rows(tmp_path, rows, sandbox, *argv, max_spend_rub=0.01, run_config=str(settings))
    ledger = sandbox.ledger()
    spent = sum(micro(c["cost_rub"]) for c in ledger)
    other_processes = 1 if argv else 0
    assert 0 < spent <= micro(0.01) + other_processes * max(micro(c["cost_rub"]) for c in ledger)
    assert sorted(out) == list(range(40))
    stopped = [r for r in out.values() if r["text"] is None]
    assert stopped and {r["text_error"] for r in stopped} == {"budget_exhausted"}
    assert all(r["text"].shape == (1536,) for r in out.values() if r["text"] is not None)
    assert counters["pending_texts"] == len(stopped) and counters["failed_texts"] == 0
    assert counters["cost_micro_rub"] == spent


@pytest.mark.parametrize("argv", [(), ("--direct_num_workers=3", "--direct_running_mode=multi_threading")],
                         ids=["one-worker", "three-worker-threads"])
def test_a_text_repeated_across_batches_is_paid_once(sandbox, key_env, tmp_path, argv):
    """Requests of ~300 tokens, one in flight: a batch holds ~40 of these rows, so each of the
    20 texts comes in every one of ~10 batches. With three worker threads, batches run at once:
    a text another thread is sending is waited for, not sent again."""
    spec = load_models()[MODEL]
    models, settings = tmp_path / "models.yaml", tmp_path / "pipeline.yaml"
    fields = {f: getattr(spec, f) for f in ("tokenizer", "safety_factor", "max_inputs_per_request", "dimensions",
                                            "supports_dimensions", "price_rub_per_1m_tokens")}
    models.write_text(yaml.safe_dump({"models": {MODEL: {**fields, "max_input_tokens": 300,
                                                         "max_tokens_per_request": 300}}}))
    settings.write_text(yaml.safe_dump({"embed": {"max_in_flight": 1, "initial_in_flight": 1}}))
    rows = [{"id": i, "text": f"sentence number {i % 20} about vectors"} for i in range(400)]
    out, counters, result = _embed_rows(tmp_path, rows, sandbox, *argv, models_config=str(models),
                                        run_config=str(settings))
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert len(paid) == len(set(paid)) == 20
    batches = _batches(result)
    assert batches >= 5 and counters["reused_texts"] > 0
    if not argv:   # one worker: the first batch pays, each later one reuses all 20
        assert counters["reused_texts"] == 20 * (batches - 1)
    assert all(np.array_equal(out[i]["text"], out[i % 20]["text"]) for i in range(400))


def test_a_text_over_the_limit_gets_the_token_weighted_mean_of_its_pieces(sandbox, key_env, tmp_path):
    long_text = " ".join(f"word{i}" for i in range(12000))   # ~24k tokens: 3 or more pieces
    rows = [{"id": "long", "text": long_text}, {"id": "short", "text": "a short text"}]
    out, counters, result = _embed_rows(tmp_path, rows, sandbox)
    ledger = sandbox.ledger()
    cfg = resolve(MODEL, sandbox.base_url, KeySource())
    pieces = embedpipe.Splitter(get_encoding(), cfg.split).split("", long_text)
    assert len(pieces) >= 3 and all(p.n_tokens <= cfg.model.chunk_tokens for p in pieces)
    assert sorted(sha for c in ledger for sha in c["input_sha256"]) == sorted(
        [p.text_sha256 for p in pieces] + [hashlib.sha256(b"a short text").hexdigest()])
    with embedpipe.EmbeddingsClient(sandbox.base_url, KeySource().load()) as client:
        vectors = client.embed(MODEL, [p.text for p in pieces]).vectors
    expected = token_weighted_mean([p.n_tokens for p in pieces], list(vectors))
    assert np.allclose(out["long"]["text"], expected, atol=1e-6)
    assert not np.allclose(out["long"]["text"], vectors[0], atol=1e-3)
    assert counters["tokens"] == sum(p.n_tokens for p in pieces) + 3 and counters["failed_texts"] == 0


def test_with_a_store_a_second_pipeline_sends_nothing(sandbox, key_env, tmp_path):
    """The first pipeline puts each answer in the store as it is paid; the second, in a worker
    process of its own (so from the store's files, not from memory), sends 0 requests."""
    store = tmp_path / "store"
    long_text = " ".join(f"word{i}" for i in range(9000))   # over the limit: its pieces are stored
    rows = [{"id": i, "text": f"sentence number {i % 30} about stores"} for i in range(90)]
    rows.append({"id": 999, "text": long_text})

    def build(where):
        def _build(p):
            embedder = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url, store=str(store))
            return {"out": p | beam.Create(rows, reshuffle=False)
                    | MLTransform(write_artifact_location=str(where / "a")).with_transform(embedder)}
        return _build
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    run_pipeline(build(first), first)
    paid = sandbox.ledger()
    assert paid and list(store.rglob("*.parquet"))
    result = run_pipeline(build(second), second, "--direct_running_mode=multi_processing", "--direct_num_workers=1")
    assert sandbox.ledger() == paid
    counters = _counters(result)
    assert counters.get("requests", 0) == 0 and counters.get("cost_micro_rub", 0) == 0
    before, after = ({r["id"]: r["text"] for r in collected(where, "out")["out"]} for where in (first, second))
    assert sorted(after) == sorted(before) and all(np.array_equal(after[i], before[i]) for i in before)


def test_a_piece_without_a_vector_leaves_its_text_without_one_and_says_which():
    vector = np.ones(4, np.float32)
    parts = [Answer(vector, 10, "r1"), Answer(None, 0, None, "budget_exhausted", "not sent: ..."),
             Answer(vector, 5, "r2")]
    combined = _combined(parts)
    assert combined.vector is None and combined.error == "budget_exhausted"
    assert combined.detail.startswith("piece 2 of 3: ")
    whole = _combined([parts[0], Answer(-vector, 5, "r2")])
    assert np.allclose(whole.vector, token_weighted_mean([10, 5], [vector, -vector])) and whole.request_id == "r1,r2"


def _fail_after_embedding(row):
    raise RuntimeError(f"a sink that fails after row {row['id']} was paid for")


def test_with_a_store_a_pipeline_that_failed_after_paying_is_rerun_without_paying_again(sandbox, key_env, tmp_path):
    store = tmp_path / "store"
    rows = [{"id": i, "text": f"row {i} of a pipeline that fails downstream"} for i in range(50)]

    def build(fail):
        def _build(p):
            embedded = (p | beam.Create(rows, reshuffle=False) | MLTransform(
                write_artifact_location=str(tmp_path / f"a-{fail}")).with_transform(
                embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url, store=str(store))))
            return {"out": embedded | beam.Map(_fail_after_embedding) if fail else embedded}
        return _build
    with pytest.raises(Exception, match="a sink that fails"):
        run_pipeline(build(True), tmp_path)
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert len(paid) == 50
    run_pipeline(build(False), tmp_path)
    assert [sha for c in sandbox.ledger() for sha in c["input_sha256"]] == paid
    assert len(collected(tmp_path, "out")["out"]) == 50


def test_paid_texts_claims_keep_answers_with_vectors_and_release_the_rest():
    paid, sha, other, failed = PaidTexts(4), "a" * 64, "b" * 64, "c" * 64
    assert paid.claim([sha, other, failed]) == ({}, {}, [sha, other, failed])
    held, waiting, mine = paid.claim([sha, other, failed])
    assert (held, mine) == ({}, []) and not waiting[sha].done()
    vector = np.arange(4, dtype=np.float32)
    paid.settle(sha, Answer(vector, 7, "r1"))
    paid.settle(other, Answer(None, 0, None, "budget_exhausted", "not sent"))
    paid.release(failed)      # its batch failed
    paid.release(sha)         # settled already: nothing changes
    assert waiting[sha].result().request_id == "r1"
    assert waiting[other].result() is None and waiting[failed].result() is None   # the waiter claims them again
    held, waiting, mine = paid.claim([sha, other, failed])
    assert np.array_equal(held[sha].vector, vector) and held[sha][1:3] == (7, "r1")
    assert waiting == {} and mine == [other, failed]   # no vector: claimed again, sent again


def test_a_cli_dir_read_as_a_store_sends_nothing_and_the_long_text_gets_the_cli_document_vector(
        sandbox, key_env, tmp_path):
    rows = [r for r in corpus_rows() if r["id"] in ("en-1", "ru-2", "code-1", "long-1")]
    out = tmp_path / "out"
    assert run("--input", str(write_corpus(tmp_path / "in.parquet", rows)), "--output", str(out), "--model", MODEL,
               "--base-url", sandbox.base_url, "--doc-vectors") == 0
    charges = sandbox.ledger()
    embedded, counters, _ = _embed_rows(tmp_path, [{"id": r["id"], "text": r["text"]} for r in rows], sandbox,
                                        read_stores=[str(out)])
    assert sandbox.ledger() == charges and counters.get("requests", 0) == 0
    documents = {d["doc_id"]: d["embedding"] for d in read_kind(out, "documents").to_pylist()}
    assert np.allclose(embedded["long-1"]["text"], documents["long-1"], atol=1e-6)
    assert all(np.allclose(embedded[i]["text"], documents[i], atol=1e-6) for i in ("en-1", "ru-2", "code-1"))


def test_a_batch_waiting_on_a_text_another_batch_failed_to_send_sends_it_itself(sandbox, key_env):
    """Batch A claims SHARED and fails while sending it; batch B, in another thread, was waiting
    for it: B claims it again and sends it, and both its texts get vectors."""
    shared, own = "a text both batches have", "a text of batch B"
    service = _Service(embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url).job())
    a_sending, b_waiting = threading.Event(), threading.Event()
    send, claim = service.sender.run, service.paid.claim

    def run(request):
        if [i.text for i in request] == [shared] and not a_sending.is_set():
            a_sending.set()
            b_waiting.wait(10)
            raise RuntimeError("batch A fails while sending")
        return send(request)

    def claiming(shas):
        got = claim(shas)
        if hashlib.sha256(own.encode()).hexdigest() in got[2]:
            b_waiting.set()
        return got
    service.sender.run, service.paid.claim = run, claiming
    failed = []
    a = threading.Thread(target=lambda: failed.append(pytest.raises(RuntimeError, service.embed, [shared])))
    a.start()
    assert a_sending.wait(10)
    b = service.embed([shared, own])
    a.join(10)
    assert failed and all(r.vector is not None and r.vector.shape == (1536,) for r in b), [r.error for r in b]
    paid = [sha for c in sandbox.ledger() for sha in c["input_sha256"]]
    assert sorted(paid) == sorted(hashlib.sha256(t.encode()).hexdigest() for t in (shared, own))


def test_the_store_is_listed_as_often_as_the_run_config_says(sandbox, key_env, tmp_path):
    settings = tmp_path / "pipeline.yaml"
    settings.write_text(yaml.safe_dump({"store": {"refresh_s": 7.0}}))
    manager = embedpipe.ServiceTextEmbeddings(["text"], MODEL, sandbox.base_url, store=str(tmp_path / "store"),
                                              run_config=str(settings))
    assert manager.job().embed.store.refresh_s == 7.0


def test_a_batch_whose_request_failed_keeps_its_texts_on_the_wire_claimed(sandbox, key_env, tmp_path):
    """Batch A sends three requests (one text each): two raise, the third, carrying SHARED, is
    still on the wire. Batch B, waiting for SHARED, takes its vector when that request ends: the
    failures release only their own texts, and SHARED is billed once."""
    failing, shared, last = "a text whose request fails", "a text both batches have", "another that fails"
    service = _Service(embedpipe.ServiceTextEmbeddings(
        ["text"], MODEL, sandbox.base_url, models_config=models_config(tmp_path, max_inputs_per_request=1)).job())
    send, claim, release = service.sender.run, service.paid.claim, service.paid.release
    a_claimed, b_claimed, b_claimed_again, last_released = (threading.Event() for _ in range(4))
    b_waits: list = []

    def run(request):
        text = request[0].text
        if text in (failing, last):
            assert b_claimed.wait(10)
            raise RuntimeError(f"batch A's request of {text!r} fails")
        if text == shared and not b_claimed_again.is_set():
            assert last_released.wait(10)   # both failures are over, and whatever they released is
            if b_waits[0].done():           # SHARED was released while on the wire: B sends it too
                assert b_claimed_again.wait(10)
        return send(request)

    def claiming(shas):
        got = claim(shas)
        a_claimed.set()
        if text_sha(shared) in got[1]:
            b_waits.append(got[1][text_sha(shared)])
            b_claimed.set()
        elif text_sha(shared) in got[2] and b_waits:
            b_claimed_again.set()
        return got

    def releasing(sha):
        release(sha)
        if sha == text_sha(last):
            last_released.set()
    service.sender.run, service.paid.claim, service.paid.release = run, claiming, releasing
    a_failed = []
    a = threading.Thread(target=lambda: a_failed.append(pytest.raises(RuntimeError, service.embed,
                                                                      [failing, shared, last])))
    a.start()
    assert a_claimed.wait(10)
    b = service.embed([shared, "a text of batch B"])
    a.join(10)
    assert a_failed and all(r.vector is not None for r in b), [r.error for r in b]
    assert paid_texts(sandbox)[text_sha(shared)] == 1

"""The request runner's handling of what the service answers, without Beam.

The client is a real EmbeddingsClient against a real sandbox where the behaviour needs one;
here the pure parts (re-splitting an over-long input) and what the runner does with answers
a sandbox gives: the journal, the start of a request, refusals."""
from __future__ import annotations

from itertools import pairwise
import datetime as dt
import json
import threading
import time
import urllib.request

import numpy as np
import pytest

from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey
from service.tokenizer import get_encoding
from tests.conftest import SANDBOX_KEY
from transforms.embed.ratelimit import OK, ConcurrencyLimiter
from transforms.embed.send import Breaker, RequestRunner, request_key, resplit
from transforms.money import journal
from transforms.money.budget import BudgetGuard
from transforms.pending import Pending
from transforms.read.split import SplitConfig, Splitter
from transforms.records import ChunkRef, TextItem


def _item(text: str) -> TextItem:
    enc = get_encoding()
    n = len(enc.encode_ordinary(text))
    ref = ChunkRef("doc", 3, 5, 100, 100 + n, n, ())
    return TextItem("sha", text, n, (ref,))


def _splitter(n: int) -> Splitter:
    return Splitter(get_encoding(), SplitConfig(max_tokens=n))


def test_resplit_halves_keep_the_chunk_index_and_tile_the_token_span():
    item = _item("alpha beta gamma delta. " * 40)
    pieces = resplit(item, _splitter)
    assert len(pieces) >= 2
    assert "".join(p.text for p in pieces) == item.text
    refs = [p.refs[0] for p in pieces]
    assert {r.chunk_index for r in refs} == {3}
    assert refs[0].token_start == 100 and refs[-1].token_end == 100 + sum(p.n_tokens for p in pieces)
    assert all(a.token_end == b.token_start for a, b in pairwise(refs))
    assert all(p.n_tokens <= item.n_tokens // 2 for p in pieces)


def test_an_input_too_short_to_halve_comes_back_whole():
    item = _item("hi there")
    assert resplit(item, _splitter) == [item]


def test_a_request_already_in_this_runs_journal_is_not_paid_again(tmp_path):
    """A retried bundle packs the same texts: the id is the same, the journal answers."""
    batch = [_item("first text"), _item("second text")._replace(text_sha256="sha2")]
    rid = request_key("r1", "m", None, batch)
    assert rid == request_key("r1", "m", None, batch[::-1]) != request_key("r2", "m", None, batch)
    vectors = np.eye(2, 4, dtype=np.float32)
    row = {"request_id": rid, "model": "m", "n_inputs": 2, "prompt_tokens": 5, "total_tokens": 5,
           "cost_rub": 0.00001, "balance_after": 9.0, "attempts": 1, "latency_ms": 3.0, "status": 200,
           "started_at": dt.datetime.now(dt.UTC), "run_id": "r1"}
    journal.write_entry(str(tmp_path), "r1", row, [i.text_sha256 for i in batch], [3, 2], vectors, [6, 4])
    # nothing listens on port 9: a request actually sent would fail
    client = EmbeddingsClient("http://127.0.0.1:9/v1", ApiKey("k"), retry=RetryPolicy(max_attempts=1))
    runner = RequestRunner(client, model="m", dimensions=None, expected_dims=4,
                           guard=BudgetGuard(balance_before=None, spendable_rub=None,
                                             price_per_token_rub=1e-6, margin=1.0),
                           breaker=Breaker(), run_id="r1", resplit=lambda i: [i],
                           recall=lambda r: journal.read_entry(str(tmp_path), "r1", r))
    out = runner.run(batch[::-1])
    assert not out.pending and not out.failed
    (delivery,) = out.deliveries
    assert delivery.request_id == rid and [i.text_sha256 for i in delivery.items] == ["sha2", "sha"]
    np.testing.assert_array_equal(delivery.vectors, vectors[::-1])
    assert delivery.shares_micro == [4, 6]
    assert out.requests[0]["cost_rub"] == 0.00001


def test_started_at_is_taken_after_the_intent_so_that_it_plus_the_latency_is_when_the_answer_came(sandbox):
    """The reconciliation orders the account's charges by when each answer came (started_at +
    latency_ms): taken before a slow intent write, that point was early, and a retried
    attempt's charge was named other spending (seen once in CI, under load)."""
    written = []

    def intend(request_id, tokens, worst_case_micro):
        time.sleep(0.3)   # a slow disk
        written.append(dt.datetime.now(dt.UTC))

    with EmbeddingsClient(sandbox.base_url, ApiKey(SANDBOX_KEY)) as client:
        runner = RequestRunner(client, model="text-embedding-3-small", dimensions=None, expected_dims=1536,
                               guard=BudgetGuard(balance_before=None, spendable_rub=None,
                                                 price_per_token_rub=2e-8, margin=1.0),
                               breaker=Breaker(), run_id="r1", resplit=lambda i: [i], intend=intend)
        out = runner.run([_item("a text to embed")])
    answered = dt.datetime.now(dt.UTC)
    (row,) = out.requests
    assert row["status"] == 200 and written
    assert written[0] <= row["started_at"]
    assert row["started_at"] + dt.timedelta(milliseconds=row["latency_ms"]) <= answered


def _refused_runner(sandbox, max_refused_s, limiter=None):
    client = EmbeddingsClient(sandbox.base_url, ApiKey(SANDBOX_KEY), retry=RetryPolicy(max_refusals=0))
    breaker = Breaker()
    runner = RequestRunner(client, model="text-embedding-3-small", dimensions=None, expected_dims=1536,
                           guard=BudgetGuard(balance_before=None, spendable_rub=None, price_per_token_rub=1e-6,
                                             margin=1.0),
                           breaker=breaker, run_id="r1", resplit=lambda i: [i],
                           concurrency=limiter or ConcurrencyLimiter(1, maximum=1), max_refused_s=max_refused_s)
    return runner, breaker


def _capacity(sandbox) -> dict:
    with urllib.request.urlopen(sandbox.base_url.removesuffix("/v1") + "/healthz", timeout=10) as resp:
        return json.load(resp)["capacity"]


def _hold_the_place(sandbox) -> threading.Thread:
    """Another process's request, worked on for the sandbox's latency: it has the one place
    when this returns."""
    other = EmbeddingsClient(sandbox.base_url, ApiKey(SANDBOX_KEY))
    thread = threading.Thread(target=other.embed, args=("text-embedding-3-small", ["the other process"]))
    thread.start()
    deadline = time.monotonic() + 30
    while _capacity(sandbox)["in_progress"] < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    return thread


def _one_place(sandbox_factory, latency_ms: int):
    return sandbox_factory(key=SANDBOX_KEY, balance=100.0,
                           args=["--capacity", "1", "--capacity-mode", "429", "--latency-ms", str(latency_ms)])


def test_a_request_refused_until_its_retries_ran_out_is_sent_again(sandbox_factory):
    """The service is busy, not gone: the request goes again after each Retry-After (1 s
    here), and is answered once the place is free. Tripping the breaker here left a process's
    rows pending whenever more processes than places shared an account."""
    sb = _one_place(sandbox_factory, 2000)
    holder = _hold_the_place(sb)
    runner, breaker = _refused_runner(sb, max_refused_s=60)
    start = time.monotonic()
    out = runner.run([_item("kept out for a while")])
    elapsed = time.monotonic() - start
    holder.join()
    assert breaker.reason is None and not out.pending and len(out.deliveries) == 1
    assert [r["status"] for r in out.requests] == [200]   # one logical request, one row
    refused = _capacity(sb)["refused"]
    assert refused >= 1 and out.retries == refused
    assert elapsed >= refused + 2.0   # each refusal waited its Retry-After, and the answer took 2 s


def test_a_request_refused_for_longer_than_max_refused_s_is_pending_while_others_are_answered(sandbox_factory):
    sb = _one_place(sandbox_factory, 3000)
    holder = _hold_the_place(sb)
    limiter, stop = ConcurrencyLimiter(1, maximum=4), threading.Event()

    def others_answered():   # the process's other requests, answered meanwhile
        while not stop.is_set():
            if (permit := limiter.acquire(timeout=0.1)) is not None:
                permit.release(OK)
            time.sleep(0.05)

    answering = threading.Thread(target=others_answered)
    answering.start()
    try:
        runner, breaker = _refused_runner(sb, max_refused_s=1.0, limiter=limiter)
        out = runner.run([_item("refused on its own")])
    finally:
        stop.set()
        answering.join()
    holder.join()
    assert breaker.reason is None and [reason for _, reason in out.pending] == [Pending.UNAVAILABLE]
    assert [r["status"] for r in out.requests] == [429]


def test_a_process_refused_for_longer_than_max_refused_s_stops_sending(sandbox_factory):
    sb = _one_place(sandbox_factory, 3000)
    holder = _hold_the_place(sb)
    runner, breaker = _refused_runner(sb, max_refused_s=0.5)
    out = runner.run([_item("kept out for good")])
    holder.join()
    assert breaker.reason == Pending.UNAVAILABLE and "no answer for over 0.5 s" in breaker.message
    assert "429" in breaker.message
    assert [reason for _, reason in out.pending] == [Pending.UNAVAILABLE] and not out.deliveries


def test_a_request_that_waited_for_its_place_while_the_client_fell_back_to_float_is_paid_once():
    """The encoding is the one the request was sent with: a request that waited for a place
    while another learnt that the server ignores base64 goes out as float; an invalid answer to
    it (billed) is no reason to send it again."""
    from tests.integration.test_client_canned import KEY, Canned, embeddings_answer
    canned = Canned()
    try:
        client = EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=RetryPolicy(max_attempts=1))
        limiter = ConcurrencyLimiter(1, maximum=1)
        held = limiter.acquire()
        runner = RequestRunner(client, model="m", dimensions=None, expected_dims=4,
                               guard=BudgetGuard(balance_before=None, spendable_rub=None,
                                                 price_per_token_rub=1e-6, margin=1.0),
                               breaker=Breaker(), run_id="r1", resplit=lambda i: [i], concurrency=limiter)
        canned.script.append(lambda req: embeddings_answer(req, encoding="float"))   # the other request's
        canned.script.append(lambda req: embeddings_answer(req, count=1))            # this one's: billed, short
        batch = [_item("first text"), _item("second text")._replace(text_sha256="sha2")]
        done = {}
        waiting = threading.Thread(target=lambda: done.update(out=runner.run(batch)))
        waiting.start()
        time.sleep(0.3)                                  # it waits for the place
        client.embed("m", ["another text"])              # answered with floats to a base64 request
        assert client.encoding_format == "float"
        held.release(OK)
        waiting.join(10)
        out = done["out"]
        assert [r["json"]["encoding_format"] for r in canned.seen] == ["base64", "float"]   # sent once
        assert {f.reason for f in out.failed} == {"invalid_response"} and not out.deliveries
    finally:
        canned.close()


def _idle(sandbox) -> None:
    """Until the sandbox works on nothing: an attempt the client gave up on is charged at its end."""
    deadline = time.monotonic() + 30
    while _capacity(sandbox)["in_progress"]:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.mark.parametrize("fault, timed_out", [(["--latency-ms", "1500"], 1),
                                              (["--rate-reset-after-charge", "1"], 0)],
                         ids=["timed-out", "reset-after-charge"])
def test_an_attempt_without_an_answer_counts_as_spent_and_its_retry_goes_only_if_the_budget_holds_it(
        sandbox_factory, fault, timed_out):
    """A cap of 1000 micro-roubles, a text whose worst case is 800. 1.5 s a request against read
    timeouts of 0.5 s: the attempt times out and is billed at its end; freed, its retry went and
    was billed too (1600, the scaled-down 1.6 RUB of a 1.0 RUB cap), and a later request could
    take the room again. A connection cut after the charge: each of the 6 attempts billed.
    Counted as spent, the attempt leaves no room for a retry or another request."""
    from service.catalog import load_models
    sb = sandbox_factory(key=SANDBOX_KEY, balance=100.0, args=fault)
    price = load_models()["text-embedding-3-small"].price_per_token
    text = _item(" ".join(f"word{i}" for i in range(160)))
    assert 500 < text.n_tokens * price * 1e6 <= 1000   # one fits in 1000, two do not
    policy = RetryPolicy(initial_backoff_s=0.01, read_timeout_s=0.5, read_timeout_max_s=0.5)
    with EmbeddingsClient(sb.base_url, ApiKey(SANDBOX_KEY), retry=policy) as client:
        runner = RequestRunner(client, model="text-embedding-3-small", dimensions=None, expected_dims=1536,
                               guard=BudgetGuard(balance_before=100.0, spendable_rub=0.001,
                                                 price_per_token_rub=price, margin=1.0),
                               breaker=Breaker(), run_id="r1", resplit=lambda i: [i],
                               concurrency=ConcurrencyLimiter(1, maximum=1))
        first = runner.run([text])
        second = runner.run([text._replace(text_sha256="sha2")])
    _idle(sb)
    charged = sum(row["cost_rub"] for row in sb.ledger())
    assert charged <= 0.001, f"{charged} RUB charged under a cap of 0.001"
    assert [reason for _, reason in first.pending] == [Pending.BUDGET] and first.timed_out == timed_out
    assert [reason for _, reason in second.pending] == [Pending.BUDGET] and len(sb.ledger()) == 1

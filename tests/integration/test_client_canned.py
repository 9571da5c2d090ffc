"""EmbeddingsClient over real HTTP against a tiny stdlib server with scripted answers.

For server behaviour the sandbox does not produce on demand: HTML and empty bodies, a server
that ignores base64, wrong vector counts, resets after sending, slow answers, redirects.
Loopback only; timings are measured and reported, never asserted as upper bounds.
"""
from __future__ import annotations

import base64
import collections
import json
import logging
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from service import errors as E
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey
from tests.conftest import free_port

KEY = "sk-canned-secret-0123456789"
FAST = RetryPolicy(max_attempts=3, initial_backoff_s=0.02, max_backoff_s=0.1, max_total_s=10,
                   connect_timeout_s=2, read_timeout_s=5)


def vector_for(text: str, dims: int = 4) -> list[float]:
    return [float(len(text)), float(sum(map(ord, text)) % 97), 0.5, -1.25][:dims]


def embeddings_answer(req: dict, *, encoding: str | None = None, count: int | None = None,
                      dims: int | None = None, usage: dict | None = None) -> dict:
    """A correct answer to REQ (in reversed order, to check that the client sorts by index)."""
    inputs = req["json"]["input"]
    encoding = encoding or req["json"].get("encoding_format", "float")
    dims = dims or req["json"].get("dimensions", 4)
    data = []
    for i, text in enumerate(inputs[:count] if count is not None else inputs):
        vec = vector_for(text, dims)
        emb = (base64.b64encode(np.asarray(vec, "<f4").tobytes()).decode() if encoding == "base64"
               else vec)
        data.append({"object": "embedding", "index": i, "embedding": emb})
    tokens = sum(len(t) for t in inputs)
    return {"status": 200, "json": {"object": "list", "model": req["json"]["model"],
                                    "data": data[::-1],
                                    "usage": usage or {"prompt_tokens": tokens, "total_tokens": tokens,
                                                       "cost_rub": tokens * 1e-6, "balance": 99.5}}}


class Canned:
    """Answers requests from a script (a queue of answers or callables of the request);
    `default` answers when the script is empty. Records every request it received."""

    def __init__(self):
        self.script: collections.deque = collections.deque()
        self.default = embeddings_answer
        self.seen: list[dict] = []
        self.lock = threading.Lock()
        canned = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"   # keep-alive, so the client's pool is exercised

            def log_message(self, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                req = {"method": self.command, "path": self.path, "headers": dict(self.headers),
                       "raw": raw, "json": json.loads(raw) if raw else None, "t": time.monotonic()}
                with canned.lock:
                    canned.seen.append(req)
                    step = canned.script.popleft() if canned.script else canned.default
                answer = step(req) if callable(step) else step
                time.sleep(answer.get("delay", 0))
                if answer.get("drop"):     # read the request, then hang up without answering
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = answer.get("body", b"")
                if "json" in answer:
                    body = json.dumps(answer["json"]).encode()
                headers = {"Content-Type": "application/json", **answer.get("headers", {})}
                try:
                    self.send_response(answer["status"])
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    if "cut_after" in answer:   # half the body, then a stall or a hang-up
                        self.wfile.write(body[:answer["cut_after"]])
                        self.wfile.flush()
                        time.sleep(answer.get("stall", 0))
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    self.wfile.write(body)
                except OSError:
                    pass   # the client gave up (read timeout)

            do_GET = do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def canned():
    c = Canned()
    yield c
    c.close()


@pytest.fixture
def client(canned):
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=FAST) as c:
        yield c


def error_json(status, message, code=None):
    return {"status": status, "json": {"error": {"code": code or status, "message": message}}}


# -- success paths -------------------------------------------------------------------------

def test_base64_request_and_matrix(canned, client):
    res = client.embed("text-embedding-3-small", ["hello", "мир", "third one"])
    req = canned.seen[0]
    assert req["method"] == "POST" and req["path"] == "/v1/embeddings"
    assert req["json"] == {"model": "text-embedding-3-small", "input": ["hello", "мир", "third one"],
                           "encoding_format": "base64"}
    assert "мир".encode() in req["raw"]          # UTF-8 on the wire, not \\u escapes
    assert req["headers"]["Authorization"] == f"Bearer {KEY}"
    assert req["headers"]["X-Request-Id"] == res.request_id and len(res.request_id) == 32
    assert res.vectors.dtype == np.float32 and res.vectors.shape == (3, 4)
    assert np.array_equal(res.vectors[1], np.float32(vector_for("мир")))
    assert (res.usage.prompt_tokens, res.usage.total_tokens, res.usage.balance) == (17, 17, 99.5)
    assert res.usage.cost_rub == pytest.approx(17e-6)
    assert (res.status, res.attempts, res.uncertain_attempts, res.model) == (200, 1, 0, "text-embedding-3-small")
    assert res.latency_ms > 0


def test_given_request_id_and_dimensions_are_sent(canned, client):
    res = client.embed("m", ["a"], dimensions=2, request_id="my-id-1")
    assert canned.seen[0]["headers"]["X-Request-Id"] == "my-id-1" == res.request_id
    assert canned.seen[0]["json"]["dimensions"] == 2 and res.vectors.shape == (1, 2)


def test_dimensions_mismatch_is_invalid(canned, client):
    canned.script.append(lambda req: embeddings_answer(req, dims=4))
    with pytest.raises(E.InvalidResponseError, match="asked for 2 dimensions, got 4"):
        client.embed("m", ["a"], dimensions=2)


def test_server_ignoring_base64_is_accepted_and_float_asked_from_then_on(canned, client, caplog):
    canned.default = lambda req: embeddings_answer(req, encoding="float")
    with caplog.at_level(logging.WARNING, logger="service.client"):
        first = client.embed("m", ["one", "two"])
        second = client.embed("m", ["one", "two"])
    assert [r["json"]["encoding_format"] for r in canned.seen] == ["base64", "float"]
    assert np.array_equal(first.vectors, second.vectors)
    assert sum("ignores encoding_format=base64" in r.getMessage() for r in caplog.records) == 1
    assert client.encoding_format == "float"


def test_float_client_gets_the_same_vectors_as_base64(canned):
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), encoding_format="float") as c:
        as_float = c.embed("m", ["x", "yy"])
    with EmbeddingsClient(canned.base_url, ApiKey(KEY)) as c:
        as_b64 = c.embed("m", ["x", "yy"])
    assert np.array_equal(as_float.vectors, as_b64.vectors)


def test_balance_and_stats(canned, client):
    canned.script.extend([{"status": 200, "json": {"balance": 12.5, "budget": 3}},
                          {"status": 200, "json": {"balance": 7}},
                          {"status": 200, "json": {"daily_usage": 0.25, "monthly_usage": 1}}])
    b1, b2, s = client.balance(), client.balance(), client.stats()
    assert (b1.balance, b1.budget, b2.budget) == (12.5, 3.0, None)
    assert (s.daily_usage, s.monthly_usage) == (0.25, 1.0)
    assert [r["path"] for r in canned.seen] == ["/v1/service/balance"] * 2 + ["/v1/service/stats"]
    assert all(r["method"] == "GET" and r["raw"] == b"" for r in canned.seen)


def test_concurrent_use_of_one_client(canned, client):
    texts = [[f"t{i}-{j}" for j in range(1 + i % 5)] for i in range(160)]
    with ThreadPoolExecutor(16) as pool:
        results = list(pool.map(lambda t: client.embed("m", t), texts))
    for t, res in zip(texts, results, strict=True):
        assert np.array_equal(res.vectors, np.asarray([vector_for(x) for x in t], np.float32))
    assert len({r.request_id for r in results}) == 160


# -- local validation ----------------------------------------------------------------------

@pytest.mark.parametrize("inputs,exc", [([], ValueError), (["ok", ""], ValueError),
                                        ("a string", TypeError), (["ok", None], TypeError)])
def test_bad_inputs_are_refused_locally(canned, client, inputs, exc):
    with pytest.raises(exc):
        client.embed("m", inputs)
    assert canned.seen == []


# -- invalid 200 answers: raised once, never retried ---------------------------------------

@pytest.mark.parametrize("answer,fragment", [
    (lambda req: embeddings_answer(req, count=1), "1 embeddings for 2 inputs"),
    (lambda req: {**embeddings_answer(req), "json": {**embeddings_answer(req)["json"],
                                                     "data": [{"index": 0, "embedding": [1.0, 2.0]},
                                                              {"index": 1, "embedding": [1.0]}]}},
     "differ in length"),
    ({"status": 200, "body": b"<html>ok</html>", "headers": {"Content-Type": "text/html"}},
     r"non-JSON body \(text/html, 15 bytes\)"),
])
def test_invalid_answers(canned, client, answer, fragment):
    canned.script.append(answer)
    with pytest.raises(E.InvalidResponseError, match=fragment) as info:
        client.embed("m", ["a", "b"])
    assert len(canned.seen) == 1 and info.value.attempts == 1 and not info.value.retryable


def test_invalid_answer_keeps_the_usage_it_was_billed(canned, client):
    canned.script.append(lambda req: embeddings_answer(req, count=1))
    with pytest.raises(E.InvalidResponseError) as info:
        client.embed("m", ["ab", "cd"])
    assert info.value.usage.total_tokens == 4


# -- retries -------------------------------------------------------------------------------

def test_html_502_then_200_is_retried_with_the_same_request_id(canned, client, caplog):
    canned.script.append({"status": 502, "body": b"<html><h1>Bad Gateway</h1></html>" * 40,
                          "headers": {"Content-Type": "text/html"}})
    with caplog.at_level(logging.INFO, logger="service.client"):
        res = client.embed("m", ["a"])
    assert (res.attempts, res.uncertain_attempts) == (2, 1)
    assert len({r["headers"]["X-Request-Id"] for r in canned.seen}) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "attempt 1/3 failed (HTTP 502)" in lines[0] and res.request_id in lines[0]


def test_persistent_empty_503_exhausts_attempts(canned, client):
    canned.default = {"status": 503, "body": b""}
    with pytest.raises(E.InternalServerError, match="empty body") as info:
        client.embed("m", ["a"])
    e = info.value
    assert (e.attempts, e.uncertain_attempts, e.status) == (3, 3, 503) and len(canned.seen) == 3
    assert "attempts=3" in str(e)


def test_permanent_errors_are_raised_at_once(canned, client):
    canned.script.append(error_json(400, "Unknown model 'nope'", "model_not_found"))
    with pytest.raises(E.BadRequestError, match="Unknown model") as info:
        client.embed("nope", ["a"])
    assert info.value.attempts == 1 and len(canned.seen) == 1


def measured_gap(canned) -> float:
    return canned.seen[1]["t"] - canned.seen[0]["t"]


@pytest.mark.parametrize("headers,floor", [({"Retry-After": "1"}, 1.0),
                                           ({"retry-after-ms": "300"}, 0.3)])
def test_retry_after_is_obeyed(canned, client, headers, floor, record_property):
    canned.script.append({**error_json(429, "slow down"), "headers": headers})
    res = client.embed("m", ["a"])
    gap = measured_gap(canned)
    record_property("retry_after_gap_s", gap)
    print(f"\nRetry-After {headers}: measured gap between attempts {gap:.3f} s")
    assert res.attempts == 2 and res.uncertain_attempts == 0 and gap >= floor


def test_a_request_refused_more_often_than_max_attempts_still_goes_through(canned, client):
    """Several clients sharing an account's capacity may see one request refused many times in
    a row: a 429 asks for a wait, it is not a failed attempt."""
    refused = {**error_json(429, "too many concurrent requests"), "headers": {"Retry-After": "0"}}
    canned.script.extend([refused] * 5)
    res = client.embed("m", ["a"])
    assert res.attempts == 6 and res.vectors.shape == (1, 4)     # FAST allows 3 failed attempts
    canned.script.extend([refused] * (FAST.max_refusals + 1))
    with pytest.raises(E.RateLimitError) as info:
        client.embed("m", ["a"])
    assert info.value.attempts == FAST.max_refusals + 1


def test_retry_after_beyond_the_time_cap_gives_up_at_once(canned):
    canned.script.append({**error_json(429, "come back later"), "headers": {"Retry-After": "3600"}})
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=FAST) as c:
        with pytest.raises(E.RateLimitError) as info:
            c.balance()
    assert info.value.retry_after == 3600 and info.value.attempts == 1


def test_total_time_cap_stops_before_max_attempts(canned):
    canned.default = {**error_json(500, "boom"), "delay": 0.2}
    policy = RetryPolicy(max_attempts=50, initial_backoff_s=0.05, max_backoff_s=0.05,
                         max_total_s=0.6, jitter=0)
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        with pytest.raises(E.InternalServerError) as info:
            c.embed("m", ["a"])
    assert 2 <= info.value.attempts < 50 and info.value.latency_ms >= 400


def test_reset_after_send_is_retried_and_counted_uncertain(canned, client):
    canned.script.append({"drop": True})
    res = client.embed("m", ["a"])
    assert (res.attempts, res.uncertain_attempts) == (2, 1)


@pytest.mark.parametrize("slow", [{"delay": 0.6}, {"cut_after": 40, "stall": 0.6}],
                         ids=["no-headers-in-time", "body-stalls"])
def test_read_timeout_is_uncertain_and_a_request_times_out_twice_at_most(canned, slow):
    """Each timed-out attempt may be billed: the second waits the ceiling, there is no third."""
    canned.default = lambda req: {**embeddings_answer(req), **slow}
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, read_timeout_s=0.2, read_timeout_max_s=0.3)
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        with pytest.raises(E.APITimeoutError, match="may have been billed") as info:
            c.embed("m", ["a"])
    assert (info.value.attempts, info.value.uncertain_attempts, info.value.timed_out_attempts) == (2, 2, 2)
    assert len(canned.seen) == 2


def test_the_first_answer_is_waited_for_up_to_the_ceiling(canned):
    canned.default = lambda req: {**embeddings_answer(req), "delay": 0.6}
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, read_timeout_s=0.2, read_timeout_max_s=5)
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        res = c.embed("m", ["a"])
    assert (res.attempts, res.timed_out_attempts) == (1, 0)


def test_the_retry_after_a_timeout_waits_up_to_the_ceiling_and_is_answered(canned):
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, read_timeout_s=0.2, read_timeout_max_s=5)
    timeouts = []
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        c.embed("m", ["fast"])                     # answers came fast: the floor from now on
        canned.default = lambda req: {**embeddings_answer(req), "delay": 0.6}
        res = c.embed("m", ["a"], on_timeout=lambda: timeouts.append(len(canned.seen)))
        assert (res.attempts, res.uncertain_attempts, res.timed_out_attempts) == (2, 1, 1)
        assert timeouts == [2] and len(canned.seen) == 3
        # an answer came after ~0.6 s: the next request's first attempt waits 3x that, not the floor
        res = c.embed("m", ["b"])
    assert (res.attempts, res.timed_out_attempts) == (1, 0)


def test_a_timeout_after_other_failures_still_gets_its_one_retry_and_no_more(canned):
    canned.script.extend([error_json(503, "busy")] * 2)
    canned.default = lambda req: {**embeddings_answer(req), "delay": 0.6}
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, read_timeout_s=0.2, read_timeout_max_s=0.3)
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        with pytest.raises(E.APITimeoutError) as info:
            c.embed("m", ["a"])
    assert (info.value.attempts, info.value.timed_out_attempts) == (4, 2) and len(canned.seen) == 4


def test_each_attempt_that_may_be_billed_is_told_before_its_retry_and_a_hook_may_stop_it(canned):
    """A 429 and a 400 are not billed; a 502, a reset after sending and a read timeout may be:
    the caller counts each before another attempt goes, and stops the request by raising."""
    canned.script.extend([error_json(429, "slow down"), error_json(502, "gateway"), {"drop": True},
                          lambda req: {**embeddings_answer(req), "delay": 0.6}])
    policy = RetryPolicy(max_attempts=6, initial_backoff_s=0.01, read_timeout_s=0.2, read_timeout_max_s=0.3)
    told = []
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=policy) as c:
        res = c.embed("m", ["a"], on_unanswered=told.append)
        assert (res.attempts, res.uncertain_attempts) == (5, 3) and told == [False, False, True]

        class Enough(Exception):
            pass

        def stop(timed_out):
            raise Enough

        canned.script.append(error_json(503, "busy"))
        with pytest.raises(Enough):
            c.embed("m", ["b"], on_unanswered=stop)
    assert len(canned.seen) == 6   # the 503's retry never left


def test_body_cut_short_is_retried_and_counted_uncertain(canned, client):
    canned.script.append(lambda req: {**embeddings_answer(req), "cut_after": 40})
    res = client.embed("m", ["a", "b"])
    assert (res.attempts, res.uncertain_attempts) == (2, 1)
    assert res.vectors.shape == (2, 4)


def test_answers_are_read_and_decoded_at_most_max_decoding_at_once(canned, monkeypatch):
    import service.client as client_module
    busy, most, lock = [0], [0], threading.Lock()
    decode = client_module.decode_vectors

    def slow_decode(data, n):
        with lock:
            busy[0] += 1
            most[0] = max(most[0], busy[0])
        time.sleep(0.05)
        try:
            return decode(data, n)
        finally:
            with lock:
                busy[0] -= 1

    monkeypatch.setattr(client_module, "decode_vectors", slow_decode)
    with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=FAST, max_decoding=2) as c:
        with ThreadPoolExecutor(8) as pool:
            results = list(pool.map(lambda i: c.embed("m", [f"text {i}"]), range(16)))
    assert [r.vectors.shape for r in results] == [(1, 4)] * 16
    assert 1 <= most[0] <= 2


def test_connection_refused_is_retried_and_certain():
    with EmbeddingsClient(f"http://127.0.0.1:{free_port()}/v1", ApiKey(KEY), retry=FAST) as c:
        with pytest.raises(E.APIConnectionError, match="cannot connect") as info:
            c.embed("m", ["a"])
    e = info.value
    assert not isinstance(e, E.APITimeoutError)
    assert (e.attempts, e.uncertain_attempts, e.status) == (3, 0, None)


def test_redirects_are_not_followed(canned, client):
    canned.script.append({"status": 307, "headers": {"Location": "http://127.0.0.1:1/x"}})
    with pytest.raises(E.APIStatusError) as info:
        client.embed("m", ["a"])
    assert info.value.status == 307 and info.value.attempts == 1 and len(canned.seen) == 1


# -- the key never leaks -------------------------------------------------------------------

def _exception_texts(e: BaseException) -> list[str]:
    texts, seen, stack = [], set(), [e]
    while stack:
        x = stack.pop()
        if x is None or id(x) in seen:
            continue
        seen.add(id(x))
        texts += [str(x), repr(x), repr(x.args), repr(vars(x))]
        for value in vars(x).values():
            assert "requests" not in type(value).__module__, f"{type(value)} attached to {type(x)}"
        stack += [x.__cause__, x.__context__]
    return texts


def test_the_key_never_appears_on_any_error_path(canned, caplog):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    echo = f"invalid key {KEY}"
    scripted = [error_json(401, echo, KEY), error_json(402, echo), error_json(403, echo),
                error_json(400, echo), {**error_json(429, echo), "headers": {"Retry-After": "0"}},
                {"status": 502, "body": f"<html>{KEY}</html>".encode(), "headers": {"Content-Type": "text/html"}},
                {"drop": True}, {"status": 200, "body": KEY.encode()},
                lambda req: embeddings_answer(req, count=0)]
    policy = RetryPolicy(max_attempts=1, max_refusals=0, read_timeout_s=0.3)
    errors = []
    with caplog.at_level(logging.DEBUG):
        for base in (canned.base_url, dead):
            with EmbeddingsClient(base, ApiKey(KEY), retry=policy) as c:
                assert KEY not in repr(c) and KEY not in str(vars(c))
                for answer in (scripted if base != dead else [None]):
                    canned.script.append(answer) if answer else None
                    with pytest.raises(E.EmbeddingsError) as info:
                        c.embed("m", ["a"])
                    errors.append(info.value)
        # and through the retry log lines
        canned.script.extend([error_json(500, echo), {"drop": True}])
        with EmbeddingsClient(canned.base_url, ApiKey(KEY), retry=FAST) as c:
            c.embed("m", ["a"])
    assert len(errors) == len(scripted) + 1
    assert {type(e) for e in errors} >= {E.AuthenticationError, E.InsufficientBalanceError,
                                         E.PermissionDeniedError, E.BadRequestError,
                                         E.RateLimitError, E.InternalServerError,
                                         E.APIConnectionError, E.InvalidResponseError}
    for e in errors:
        assert not any(KEY in t for t in _exception_texts(e)), type(e)
    assert caplog.records and not any(KEY in r.getMessage() for r in caplog.records)


def test_account_answers_of_the_wrong_shape_are_invalid(canned, client):
    canned.script.extend([{"status": 200, "json": {"balance": "12"}},
                          {"status": 200, "json": {"daily_usage": 1}}])
    with pytest.raises(E.InvalidResponseError, match="balance is '12'") as info:
        client.balance()
    assert info.value.request_id == canned.seen[0]["headers"]["X-Request-Id"]
    with pytest.raises(E.InvalidResponseError, match="monthly_usage is None"):
        client.stats()

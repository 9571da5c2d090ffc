"""Error bodies -> typed errors, and embedding lists -> one float32 matrix, without HTTP."""
import base64
import json
import pickle

import numpy as np
import pytest

from service import errors as E
from service.client import _Invalid, decode_vectors, parse_usage


def err(status, body, ctype="application/json", **kw):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return E.error_from_response(status, {"content-type": ctype}, raw, request_id="rid", **kw)


@pytest.mark.parametrize("status,cls", [
    (400, E.BadRequestError), (401, E.AuthenticationError), (402, E.InsufficientBalanceError),
    (403, E.PermissionDeniedError), (404, E.NotFoundError), (413, E.RequestTooLargeError),
    (429, E.RateLimitError), (500, E.InternalServerError), (503, E.InternalServerError),
    (422, E.APIStatusError), (409, E.APIStatusError)])
def test_status_maps_to_class(status, cls):
    e = err(status, {"error": {"code": status, "message": "nope"}})
    assert type(e) is cls and e.status == status and e.code == status
    assert e.message == f"HTTP {status}: nope" and e.request_id == "rid"
    assert e.retryable is E.is_retryable_status(status)


def test_openai_shape_with_string_code_and_type():
    e = err(400, {"error": {"message": "Unknown model 'x'", "type": "invalid_request_error",
                            "param": None, "code": "model_not_found"}})
    assert isinstance(e, E.BadRequestError) and not isinstance(e, E.ContextLengthExceededError)
    assert e.code == "model_not_found" and e.error_type == "invalid_request_error"
    assert str(e) == "HTTP 400 (model_not_found): Unknown model 'x' [request_id=rid]"


def test_context_length_numbers_are_parsed():
    msg = ("This model's maximum context length is 8192 tokens, however you requested 8610 "
           "tokens (8610 in your prompt). Please reduce your prompt.")
    e = err(400, {"error": {"code": "context_length_exceeded", "message": msg,
                            "type": "invalid_request_error"}})
    assert isinstance(e, E.ContextLengthExceededError)
    assert (e.max_tokens, e.requested_tokens) == (8192, 8610)
    # the wording alone is enough, whatever the code
    e2 = err(400, {"error": {"code": 400, "message": msg}})
    assert isinstance(e2, E.ContextLengthExceededError) and e2.max_tokens == 8192
    # the code alone too, without numbers
    e3 = err(400, {"error": {"code": "context_length_exceeded", "message": "too long"}})
    assert isinstance(e3, E.ContextLengthExceededError) and e3.max_tokens is None


def test_html_body_is_described_not_quoted():
    html = b"<html><body><h1>502 Bad Gateway</h1>" + b"x" * 1200 + b"</body></html>"
    e = err(502, html, ctype="text/html; charset=utf-8")
    assert isinstance(e, E.InternalServerError)
    assert e.message == f"HTTP 502: HTTP 502 with a non-JSON body (text/html, {len(html)} bytes)"
    assert "<html" not in str(e)


@pytest.mark.parametrize("body,expected", [
    (b"", "HTTP 503 with an empty body"),
    (b"  \n", "HTTP 503 with an empty body"),
    (b"[1, 2]", "HTTP 503 with an unexpected JSON body (list)"),
    (b'{"error": "overloaded"}', "overloaded"),
    (b'{"detail": "Service Unavailable"}', "Service Unavailable"),
    (b'{"error": {"code": 503}}', "HTTP 503 (no message)"),
])
def test_odd_bodies_survive(body, expected):
    assert err(503, body).message == f"HTTP 503: {expected}"


def test_long_messages_are_cut_to_one_line():
    e = err(400, {"error": {"message": "a\nb " + "z" * 2000}})
    assert "\n" not in e.message and len(e.message) < 600


def test_server_echo_of_the_key_is_scrubbed():
    key = "sk-very-secret-123"
    e = err(401, {"error": {"code": key, "message": f"bad key {key}"}}, secret=key)
    assert key not in str(e) and key not in repr(e.args) and key not in str(e.code)


def test_rate_limit_carries_retry_after():
    e = err(429, {"error": {"code": 429, "message": "slow down"}}, retry_after=1.5)
    assert isinstance(e, E.RateLimitError) and e.retry_after == 1.5 and e.retryable


def test_errors_pickle_with_their_attributes():
    e = err(400, {"error": {"code": "context_length_exceeded",
                            "message": "maximum context length is 10 tokens, however you requested 12 tokens"}})
    e.attempts, e.uncertain_attempts = 3, 2
    back = pickle.loads(pickle.dumps(e))
    assert type(back) is E.ContextLengthExceededError and str(back) == str(e)
    assert (back.max_tokens, back.attempts, back.uncertain_attempts, back.status) == (10, 3, 2, 400)


# -- vectors ---------------------------------------------------------------------------------

def b64(vec):
    return base64.b64encode(np.asarray(vec, dtype="<f4").tobytes()).decode()


@pytest.mark.parametrize("dims", [6, 8])   # 24 bytes: whole base64 quanta; 32: padded
def test_base64_and_float_decode_to_the_same_matrix_in_index_order(dims):
    rng = np.random.default_rng(0)
    m = rng.standard_normal((3, dims)).astype(np.float32)
    order = [2, 0, 1]
    as_b64 = [{"object": "embedding", "index": i, "embedding": b64(m[i])} for i in order]
    as_float = [{"object": "embedding", "index": i, "embedding": [float(x) for x in m[i]]} for i in order]
    v1, enc1 = decode_vectors(as_b64, 3)
    v2, enc2 = decode_vectors(as_float, 3)
    assert (enc1, enc2) == ("base64", "float")
    assert v1.dtype == v2.dtype == np.float32 and v1.shape == (3, dims)
    assert np.array_equal(v1, m) and np.array_equal(v2, m)
    assert v1.flags.writeable


@pytest.mark.parametrize("data,n,fragment", [
    ([{"index": 0, "embedding": [1.0]}], 2, "1 embeddings for 2 inputs"),
    ([{"index": 0, "embedding": [1.0]}, {"index": 0, "embedding": [1.0]}], 2, "not a permutation"),
    ([{"index": 5, "embedding": [1.0]}], 1, "not a permutation"),
    ([{"index": True, "embedding": [1.0]}], 1, "not a permutation"),
    ([{"index": 0, "embedding": [1.0, 2.0]}, {"index": 1, "embedding": [1.0]}], 2, "differ in length: 1..2"),
    ([{"index": 0, "embedding": []}], 1, "empty"),
    ([{"index": 0, "embedding": b64([1, 2])}, {"index": 1, "embedding": [1.0, 2.0]}], 2, "expected all"),
    ([{"index": 0, "embedding": ["a", "b"]}], 1, "other than numbers"),
    ([{"index": 0, "embedding": [float("nan")]}], 1, "NaN"),
    ("nope", 1, "not a list"),
    ([{"index": 0, "embedding": b64(range(6))}, {"index": 1, "embedding": b64(range(3))}], 2,
     "differ in length: 12..24 bytes"),
    ([{"index": 0, "embedding": b64(range(2))}, {"index": 1, "embedding": b64(range(3))[:12]}], 2,
     "differ in length: 8..9 bytes"),   # one string padded: 12 characters each, unequal vectors
])
def test_bad_lists_are_rejected_with_the_reason(data, n, fragment):
    with pytest.raises(_Invalid, match=fragment):
        decode_vectors(data, n)


def test_base64_that_is_not_float32_is_flagged_undecodable():
    with pytest.raises(_Invalid, match="6 bytes") as info:
        decode_vectors([{"index": 0, "embedding": base64.b64encode(b"abcdef").decode()}], 1)
    assert info.value.undecodable
    with pytest.raises(_Invalid, match="not valid base64") as info:
        decode_vectors([{"index": 0, "embedding": "%%%"}], 1)
    assert info.value.undecodable
    good = b64(range(6))   # a bad character in a later vector
    with pytest.raises(_Invalid, match="not valid base64"):
        decode_vectors([{"index": 0, "embedding": good}, {"index": 1, "embedding": good[:5] + "%" + good[6:]}], 2)
    with pytest.raises(_Invalid, match="not valid base64"):
        decode_vectors([{"index": 0, "embedding": "дд" * 16}], 1)


def test_usage_parsing():
    u = parse_usage({"usage": {"prompt_tokens": 5, "total_tokens": 5, "cost_rub": 1.2e-05,
                               "balance": 999.5}})
    assert (u.prompt_tokens, u.total_tokens, u.cost_rub, u.balance) == (5, 5, 1.2e-05, 999.5)
    # an OpenAI-compatible server without the billing fields still parses
    u2 = parse_usage({"usage": {"prompt_tokens": 5}})
    assert (u2.total_tokens, u2.cost_rub, u2.balance) == (5, None, None)
    for bad in ({}, {"usage": {"prompt_tokens": -1}}, {"usage": {"prompt_tokens": "5"}},
                {"usage": {"prompt_tokens": 5, "cost_rub": "1"}}):
        with pytest.raises(_Invalid):
            parse_usage(bad)

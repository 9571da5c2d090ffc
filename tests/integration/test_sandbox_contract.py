"""The sandbox against the spec, over real HTTP: one test per row of the spec's tables and
per status the sandbox answers (what-the-spec-leaves-open.md fills in the embeddings errors)."""
from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import math

import numpy as np
import pytest
import requests
import yaml

from service.catalog import load_models
from service.credentials import key_fingerprint
from service.sandbox.embedder import embed_text
from service.sandbox.launcher import SandboxError, SandboxProcess
from service.sandbox.money import cost_micro, to_micro
from service.tokenizer import get_encoding

KEY = "sk-contract-key"
MODELS = load_models()
SMALL = "text-embedding-3-small"
ENC = get_encoding()
AUTH = {"Authorization": f"Bearer {KEY}"}


def tokens(text: str) -> int:
    return len(ENC.encode_ordinary(text))


def post(sb, body, headers=None, raw: bytes | None = None, session=requests):
    hdrs = {**getattr(sb, "auth", AUTH), "Content-Type": "application/json", **(headers or {})}
    data = raw if raw is not None else json.dumps(body).encode()
    return session.post(sb.base_url + "/embeddings", data=data, headers=hdrs, timeout=30)


def get(sb, what: str, headers=None):
    headers = getattr(sb, "auth", AUTH) if headers is None else headers
    return requests.get(f"{sb.base_url}/service/{what}", headers=headers, timeout=30)


SKEWED = "vendorF-embeddings-giga-r"
MAX_BODY = 256 * 1024
# One account per test that checks exact money, so those tests can share one sandbox process:
# name -> (balance RUB, key budget RUB or None). The key of account NAME is "sk-NAME".
POOR_TEXT = "a request that costs one micro-rouble more than there is"
POOR_COST = cost_micro(tokens(POOR_TEXT), MODELS[SMALL].price_per_token)
ACCOUNTS = {"shape": (1000.0, None), "plain": (12.5, None), "budgeted": (12.5, 2.0), "stats": (100.0, None),
            "ledger": (100.0, None), "refused": (1.0, None), "lenient": (0.2, None),
            "poor": ((POOR_COST - 1) / 1e6, None), "capped": (100.0, (POOR_COST - 1) / 1e6)}


class Account:
    def __init__(self, sb, name: str):
        self.sb, self.key = sb, f"sk-{name}"
        self.base_url = sb.base_url
        self.auth = {"Authorization": f"Bearer {self.key}"}

    def ledger(self) -> list[dict]:
        return [r for r in self.sb.ledger() if r["key_id"] == key_fingerprint(self.key)]


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One sandbox for the whole module: KEY's account for answers only, plus an isolated
    account per money-checking test (see ACCOUNTS)."""
    from service.sandbox.launcher import SandboxProcess
    tmp = tmp_path_factory.mktemp("contract")
    accounts = tmp / "accounts.yaml"
    accounts.write_text(yaml.safe_dump({"accounts": {
        name: {"balance": bal, "keys": [{"key": f"sk-{name}", **({"budget": bud} if bud is not None else {})}]}
        for name, (bal, bud) in ACCOUNTS.items()}}))
    with SandboxProcess(tmp / "sb.db", key=KEY, balance=1000.0,
                        args=["--accounts", str(accounts), "--account-rps", "1000", "--account-burst", "1000",
                              "--max-body-bytes", str(MAX_BODY), "--token-skew", f"{SKEWED}=1.5"]) as sb:
        yield sb


@pytest.fixture
def account(shared, request):
    """The isolated account named by indirect parametrization: `@uses("name")`."""
    return Account(shared, request.param)


def uses(name: str):
    return pytest.mark.parametrize("account", [name], indirect=True, ids=[name])


def test_healthz_needs_no_key(shared):
    r = requests.get(shared.base_url.removesuffix("/v1") + "/healthz", timeout=10)
    assert r.status_code == 200 and r.json()["status"] == "ok"


@uses("shape")
def test_float_response_shape_usage_and_vectors(account):
    sb = account
    texts = ["The quick brown fox", "jumps over the lazy dog", "Привет, мир"]
    r = post(sb, {"model": SMALL, "input": texts})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "list" and body["model"] == SMALL
    assert [d["object"] for d in body["data"]] == ["embedding"] * 3
    assert [d["index"] for d in body["data"]] == [0, 1, 2]
    for text, item in zip(texts, body["data"], strict=True):
        vec = np.array(item["embedding"], dtype=np.float32)
        assert vec.shape == (MODELS[SMALL].dimensions,)
        np.testing.assert_array_equal(vec, embed_text(SMALL, text, MODELS[SMALL].dimensions))
    n = sum(tokens(t) for t in texts)
    usage = body["usage"]
    assert usage["prompt_tokens"] == usage["total_tokens"] == n
    assert usage["cost_rub"] == round(n * MODELS[SMALL].price_per_token, 6) > 0
    assert to_micro(usage["balance"]) == to_micro(1000.0) - to_micro(usage["cost_rub"])


def test_base64_is_float32_little_endian_of_the_same_vector(shared):
    texts = ["alpha", "beta gamma"]
    as_float = post(shared, {"model": SMALL, "input": texts}).json()
    as_b64 = post(shared, {"model": SMALL, "input": texts, "encoding_format": "base64"}).json()
    for f, b in zip(as_float["data"], as_b64["data"], strict=True):
        assert isinstance(b["embedding"], str)
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
        assert abs(float(np.linalg.norm(decoded)) - 1.0) < 1e-5


def test_single_string_input_gives_one_entry(shared):
    body = post(shared, {"model": SMALL, "input": "just one"}).json()
    assert len(body["data"]) == 1 and body["data"][0]["index"] == 0


def test_index_follows_input_order_for_a_large_batch(shared):
    texts = [f"document number {i} about topic {i % 7}" for i in range(250)]
    body = post(shared, {"model": "vendorD-embed-2312", "input": texts, "encoding_format": "base64"}).json()
    assert [d["index"] for d in body["data"]] == list(range(250))
    for i in (0, 137, 249):
        vec = np.frombuffer(base64.b64decode(body["data"][i]["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(vec, embed_text("vendorD-embed-2312", texts[i], 1024))


@pytest.mark.parametrize("model", sorted(set(MODELS) - {SKEWED}))
def test_every_model_answers_with_its_default_length(shared, model):
    body = post(shared, {"model": model, "input": "hello", "encoding_format": "base64"}).json()
    assert len(base64.b64decode(body["data"][0]["embedding"])) == 4 * MODELS[model].dimensions
    assert body["usage"]["cost_rub"] == round(tokens("hello") * MODELS[model].price_per_token, 6)


def test_dimensions_shortens_supported_models(shared):
    body = post(shared, {"model": SMALL, "input": ["short me"], "dimensions": 256}).json()
    vec = np.array(body["data"][0]["embedding"], dtype=np.float32)
    assert vec.shape == (256,)
    np.testing.assert_array_equal(vec, embed_text(SMALL, "short me", 256, MODELS[SMALL].dimensions))


@uses("plain")
def test_balance_without_budget_has_no_budget_field(account):
    assert get(account, "balance").json() == {"balance": 12.5}


@uses("budgeted")
def test_balance_with_budget_reports_the_remaining_budget(account):
    sb = account
    assert get(sb, "balance").json() == {"balance": 12.5, "budget": 2.0}
    cost = post(sb, {"model": SMALL, "input": "spend a little"}).json()["usage"]["cost_rub"]
    after = get(sb, "balance").json()
    assert to_micro(after["budget"]) == to_micro(2.0) - to_micro(cost)
    assert to_micro(after["balance"]) == to_micro(12.5) - to_micro(cost)


@uses("stats")
def test_stats_sum_the_charges_of_the_account(account):
    sb = account
    assert get(sb, "stats").json() == {"daily_usage": 0.0, "monthly_usage": 0.0}
    costs = [post(sb, {"model": m, "input": ["some text " * k]}).json()["usage"]["cost_rub"]
             for k, m in ((1, SMALL), (50, "text-embedding-3-large"), (9, "vendorF-embeddings-2"))]
    stats = get(sb, "stats").json()
    assert to_micro(stats["daily_usage"]) == to_micro(stats["monthly_usage"]) == sum(map(to_micro, costs))


@uses("ledger")
def test_request_id_and_ledger_fields(account):
    sb = account
    texts = ["first input", "second input"]
    r1 = post(sb, {"model": SMALL, "input": texts}, headers={"X-Request-Id": "client-id-1"})
    r2 = post(sb, {"model": SMALL, "input": "no id sent"})
    assert r1.headers["X-Request-Id"] == "client-id-1" and r2.headers["X-Request-Id"]
    rows = sb.ledger()
    assert len(rows) == 2
    first, second = rows
    assert set(first) == {"request_id", "key_id", "model", "prompt_tokens", "total_tokens", "cost_rub",
                          "balance_after", "input_sha256", "created_at"}
    assert first["request_id"] == "client-id-1" and second["request_id"] == r2.headers["X-Request-Id"]
    assert first["key_id"] == key_fingerprint(sb.key) and sb.key not in json.dumps(rows)
    assert first["input_sha256"] == [hashlib.sha256(t.encode()).hexdigest() for t in texts]
    assert first["prompt_tokens"] == first["total_tokens"] == r1.json()["usage"]["total_tokens"]
    assert first["cost_rub"] == r1.json()["usage"]["cost_rub"]
    assert first["balance_after"] == r1.json()["usage"]["balance"]
    created = dt.datetime.fromisoformat(first["created_at"])
    assert created.utcoffset() == dt.timedelta(0)
    assert abs(dt.datetime.now(dt.UTC) - created) < dt.timedelta(minutes=5)


def _long_text(n_tokens: int) -> str:
    text = " word" * n_tokens
    assert tokens(text) == n_tokens
    return text


BAD_REQUESTS = {
    "unknown model": {"model": "no-such-model", "input": "x"},
    "model missing": {"input": "x"},
    "model not a string": {"model": 7, "input": "x"},
    "input missing": {"model": SMALL},
    "input empty string": {"model": SMALL, "input": ""},
    "input empty array": {"model": SMALL, "input": []},
    "input a number": {"model": SMALL, "input": 42},
    "input of token ids": {"model": SMALL, "input": [[1, 2, 3]]},
    "array element not a string": {"model": SMALL, "input": ["ok", None]},
    "array element empty": {"model": SMALL, "input": ["ok", ""]},
    "encoding_format unknown": {"model": SMALL, "input": "x", "encoding_format": "int8"},
    "dimensions on a model without support": {"model": "text-embedding-ada-002", "input": "x", "dimensions": 256},
    "dimensions over the default": {"model": SMALL, "input": "x", "dimensions": 1537},
    "dimensions zero": {"model": SMALL, "input": "x", "dimensions": 0},
    "dimensions not an integer": {"model": SMALL, "input": "x", "dimensions": "256"},
    "unknown field": {"model": SMALL, "input": "x", "temperature": 0.5},
    "body not an object": ["x"],
    "11 inputs to text-embedding-v4 (cap 10)": {"model": "text-embedding-v4", "input": ["x"] * 11},
    "sum over max_tokens_per_request": {"model": "vendorD-embed-2312", "input": [_long_text(6000)] * 3},
}


@pytest.mark.parametrize("body", BAD_REQUESTS.values(), ids=BAD_REQUESTS.keys())
def test_bad_requests_are_400_with_an_error_body(shared, body):
    r = post(shared, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["message"] and err["code"]


def test_caps_codes(shared):
    assert post(shared, BAD_REQUESTS["11 inputs to text-embedding-v4 (cap 10)"]).json()["error"]["code"] \
        == "too_many_inputs"
    assert post(shared, BAD_REQUESTS["sum over max_tokens_per_request"]).json()["error"]["code"] \
        == "max_tokens_per_request"
    assert post(shared, {"model": "text-embedding-v4", "input": ["x"] * 10}).status_code == 200


def test_over_length_input_is_context_length_exceeded_with_openai_wording(shared):
    r = post(shared, {"model": "vendorF-embeddings-2", "input": ["fine", _long_text(600)]})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("This model's maximum context length is 512 tokens, however you "
                                     "requested 600 tokens (")
    assert post(shared, {"model": "vendorF-embeddings-2", "input": _long_text(512)}).status_code == 200


@pytest.mark.parametrize("raw,ctype", [(b"{not json", "application/json"),
                                       (b"\xff\xfe", "application/json"),
                                       (b'{"model": "text-embedding-3-small", "input": "x"}', "text/plain"),
                                       (b'{"model": "text-embedding-3-small", "input": "x"}', "")],
                         ids=["malformed JSON", "not UTF-8", "text/plain", "no content type"])
def test_malformed_body_or_content_type_is_400(shared, raw, ctype):
    r = post(shared, None, raw=raw, headers={"Content-Type": ctype})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_content_type_with_charset_is_accepted(shared):
    r = post(shared, {"model": SMALL, "input": "x"}, headers={"Content-Type": "application/json; charset=utf-8"})
    assert r.status_code == 200


@uses("refused")
def test_refused_requests_charge_nothing(account):
    for body in BAD_REQUESTS.values():
        assert post(account, body).status_code == 400
    assert post(account, {"model": SMALL, "input": "x"}, headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert post(account, {"model": SMALL, "input": "x" * (MAX_BODY + 1)}).status_code == 413
    assert account.ledger() == [] and get(account, "balance").json() == {"balance": 1.0}


@pytest.mark.parametrize("endpoint", ["embeddings", "balance", "stats"])
def test_401_missing_and_wrong_key_give_the_same_body(shared, endpoint):
    def call(headers):
        if endpoint == "embeddings":
            return requests.post(shared.base_url + "/embeddings", json={"model": SMALL, "input": "x"},
                                 headers=headers, timeout=10)
        return get(shared, endpoint, headers=headers)
    answers = [call(h) for h in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": f"Basic {KEY}"},
                                 {"Authorization": "Bearer "}, {"Authorization": f"Bearer {KEY}x"})]
    assert {r.status_code for r in answers} == {401}
    assert len({r.content for r in answers}) == 1
    assert answers[0].json()["error"]["code"] == 401 and KEY not in answers[0].text
    assert call({"Authorization": f"bearer {KEY}"}).status_code == 200   # scheme is case-insensitive


@uses("poor")
def test_402_when_the_cost_exceeds_the_balance(account):
    r = post(account, {"model": SMALL, "input": POOR_TEXT})
    assert r.status_code == 402
    assert r.json()["error"]["code"] == 402 and r.json()["error"]["type"] == "insufficient_balance"
    assert account.ledger() == [] and to_micro(get(account, "balance").json()["balance"]) == POOR_COST - 1
    assert post(account, {"model": SMALL, "input": "x"}).status_code == 200   # a cheaper one still fits


@uses("capped")
def test_402_when_the_cost_exceeds_the_key_budget(account):
    r = post(account, {"model": SMALL, "input": POOR_TEXT})
    assert r.status_code == 402 and r.json()["error"]["type"] == "insufficient_budget"
    assert account.ledger() == []
    assert get(account, "balance").json() == {"balance": 100.0, "budget": (POOR_COST - 1) / 1e6}


@uses("lenient")
def test_precheck_refuses_what_would_fit(sandbox_factory, account):
    # Estimate for 10 inputs: price x min(10 x 8191, 300000) = 2.5e-6 x 81910 = 0.204775 RUB.
    body = {"model": SMALL, "input": ["tiny"] * 10}
    strict = sandbox_factory(key=KEY, balance=0.2, args=["--precheck"])
    r = post(strict, body)
    assert r.status_code == 402 and "estimated" in r.json()["error"]["message"]
    assert strict.ledger() == []
    assert post(strict, {"model": SMALL, "input": ["tiny"] * 9}).status_code == 200   # 0.184... fits
    assert post(account, body).status_code == 200   # the same balance without --precheck


def test_413_for_a_body_over_the_limit_keeps_the_connection_usable(shared):
    with requests.Session() as s:
        r = post(shared, {"model": SMALL, "input": "x" * (MAX_BODY + 1)}, session=s)
        assert r.status_code == 413 and r.json()["error"]["code"] == 413
        assert post(shared, {"model": SMALL, "input": "x" * 100}, session=s).status_code == 200


def test_429_with_retry_after_on_account_endpoints(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=1.0, args=["--account-rps", "0.2", "--account-burst", "3"])
    answers = [get(sb, what) for what in ("balance", "stats", "balance", "stats", "balance")]
    assert [r.status_code for r in answers[:3]] == [200, 200, 200]   # one bucket for both endpoints
    for limited in answers[3:]:
        assert limited.status_code == 429 and limited.json()["error"]["code"] == 429
        assert 1 <= int(limited.headers["Retry-After"]) <= 5
    # the embeddings endpoint is not limited by it
    assert post(sb, {"model": SMALL, "input": "x"}).status_code == 200


def test_account_segment_is_configurable(sandbox_factory):
    sb = sandbox_factory(key=KEY, balance=3.0, args=["--account-segment", "acme"])
    assert requests.get(sb.base_url + "/acme/balance", headers=AUTH, timeout=10).json() == {"balance": 3.0}
    assert requests.get(sb.base_url + "/service/balance", headers=AUTH, timeout=10).status_code == 404


def test_a_key_without_a_balance_is_refused_with_the_sandbox_s_reason(tmp_path):
    sb = SandboxProcess(tmp_path / "sb.db", key=KEY, balance=None)
    with pytest.raises(SandboxError, match="--key needs --balance"):
        sb.start()
    assert not sb.running()


def test_unknown_path_404_and_wrong_method_405(shared):
    assert requests.get(shared.base_url + "/models", headers=AUTH, timeout=10).status_code == 404
    assert requests.get(shared.base_url + "/embeddings", headers=AUTH, timeout=10).status_code == 405
    r = requests.post(shared.base_url + "/service/balance", headers=AUTH, json={}, timeout=10)
    assert r.status_code == 405 and r.json()["error"]["message"]


def test_token_skew_counts_more_tokens(shared):
    texts = ["one two three", "four"]
    usage = post(shared, {"model": SKEWED, "input": texts}).json()["usage"]
    assert usage["total_tokens"] == sum(math.ceil(tokens(t) * 1.5) for t in texts)
    assert usage["cost_rub"] == round(usage["total_tokens"] * MODELS[SKEWED].price_per_token, 6)
    over = post(shared, {"model": SKEWED, "input": _long_text(3000)}).json()["error"]   # 4500 > 4096
    assert over["code"] == "context_length_exceeded" and "you requested 4500 tokens" in over["message"]
    assert post(shared, {"model": SMALL, "input": texts}).json()["usage"]["total_tokens"] == \
        sum(tokens(t) for t in texts)


def test_special_token_text_is_plain_text(shared):
    usage = post(shared, {"model": SMALL, "input": "<|endoftext|> hi"}).json()["usage"]
    assert usage["total_tokens"] == tokens("<|endoftext|> hi") > 2

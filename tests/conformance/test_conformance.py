"""Does a deployment behave as the client assumes? Against a fresh sandbox by default;
`BASE_URL=https://.../v1 EMBEDDINGS_API_KEY=... make conformance` checks a real service.

Cheap on purpose, since a real key costs money: three embeddings requests with five short
inputs in all, two balance calls, one stats call, and two requests that must be refused
(unknown model, bad key) and so are never billed. Run the module as a whole: the tests share
one client and run in file order (the balance check compares with what the embeddings cost).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import requests

from service import errors as E
from service.catalog import load_models
from service.client import EmbeddingsClient, RetryPolicy
from service.credentials import ApiKey, load_api_key
from service.sandbox.launcher import SandboxProcess

MODEL = os.environ.get("CONFORMANCE_MODEL", "text-embedding-3-small")
SEGMENT = os.environ.get("CONFORMANCE_ACCOUNT_SEGMENT", "service")
TEXTS = ["conformance check", "проверка", "x = 1"]
POLICY = RetryPolicy(max_attempts=4, max_total_s=60, read_timeout_s=30)
REAL = bool(os.environ.get("BASE_URL"))


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    """(base_url, ApiKey, is_sandbox)."""
    if REAL:
        yield os.environ["BASE_URL"].rstrip("/"), load_api_key(), False
        return
    db = tmp_path_factory.mktemp("conformance") / "sandbox.db"
    with SandboxProcess(db, key="sk-conformance", balance=100.0) as sb:
        yield sb.base_url, ApiKey("sk-conformance"), True


@pytest.fixture(scope="module")
def client(target):
    base_url, key, _ = target
    with EmbeddingsClient(base_url, key, account_segment=SEGMENT, retry=POLICY) as c:
        yield c


@pytest.fixture(scope="module")
def spent() -> dict:
    """What the embeddings in this module cost, for the balance check at the end."""
    return {"cost": 0.0, "start": None}


def test_balance_shape(client, spent):
    b = client.balance()
    assert isinstance(b.balance, float) and b.balance >= 0
    assert b.budget is None or (isinstance(b.budget, float) and b.budget >= 0)
    spent["start"] = b


def test_stats_shape(client):
    s = client.stats()
    assert isinstance(s.daily_usage, float) and isinstance(s.monthly_usage, float)
    assert 0 <= s.daily_usage <= s.monthly_usage + 1e-6


def test_raw_float_envelope(target, spent):
    """The spec's default encoding and the exact envelope, read without the client."""
    base_url, key, _ = target
    resp = requests.post(f"{base_url}/embeddings", json={"model": MODEL, "input": TEXTS[:1]},
                         headers={"Authorization": f"Bearer {key.reveal()}"}, timeout=(5, 30))
    assert resp.status_code == 200
    assert resp.headers.get("Content-Type", "").startswith("application/json")
    doc = resp.json()
    assert doc["object"] == "list" and isinstance(doc["model"], str)
    (item,) = doc["data"]
    assert item["object"] == "embedding" and item["index"] == 0
    assert all(isinstance(x, (int, float)) for x in item["embedding"])
    usage = doc["usage"]
    assert set(usage) >= {"prompt_tokens", "total_tokens", "cost_rub", "balance"}
    spent["cost"] += usage["cost_rub"]
    spent["raw_vector"] = np.asarray(item["embedding"], dtype=np.float32)


def _check_result(res, n, spent):
    dims = load_models()[MODEL].dimensions
    assert res.status == 200 and res.vectors.dtype == np.float32
    assert res.vectors.shape == (n, dims), (
        f"{MODEL} answered {res.vectors.shape[1]} dimensions, configs/models.yaml says {dims}")
    u = res.usage
    assert isinstance(u.prompt_tokens, int) and u.prompt_tokens > 0
    assert u.total_tokens >= u.prompt_tokens
    assert isinstance(u.cost_rub, float) and u.cost_rub >= 0
    assert isinstance(u.balance, float)
    spent["cost"] += u.cost_rub
    spent["last_balance"] = u.balance


def test_float_through_the_client(target, spent):
    base_url, key, _ = target
    with EmbeddingsClient(base_url, key, account_segment=SEGMENT, retry=POLICY,
                          encoding_format="float") as c:
        res = c.embed(MODEL, TEXTS[:1])
    _check_result(res, 1, spent)
    spent["float_vector"] = res.vectors[0]


def test_base64_through_the_client(client, spent):
    res = client.embed(MODEL, TEXTS)
    _check_result(res, 3, spent)
    assert client.encoding_format == "base64", "the service ignored encoding_format=base64"
    # the same text in another request and encoding: the same direction (a real service
    # may differ in the last bits between calls, so compare by cosine)
    for other in (spent.get("float_vector"), spent.get("raw_vector")):
        if other is not None:
            cos = float(res.vectors[0] @ other / np.linalg.norm(res.vectors[0]) / np.linalg.norm(other))
            assert cos > 0.999


def test_unknown_model_is_400(client):
    with pytest.raises(E.BadRequestError) as info:
        client.embed("conformance-no-such-model", ["x"])
    assert info.value.status == 400 and info.value.attempts == 1


def test_bad_key_is_401(target):
    base_url, _, _ = target
    with EmbeddingsClient(base_url, ApiKey("sk-conformance-invalid-key"), account_segment=SEGMENT,
                          retry=POLICY) as c:
        for call in (lambda: c.embed(MODEL, ["x"]), c.balance):
            with pytest.raises(E.AuthenticationError) as info:
                call()
            assert info.value.status == 401


def test_balance_moved_by_what_was_charged(client, target, spent):
    start = spent["start"]
    if start is None or "last_balance" not in spent:
        pytest.skip("needs the earlier tests of this module")
    end = client.balance()
    assert end.balance <= start.balance
    if target[2]:   # the sandbox has no other spender: exact to the micro-rouble
        assert start.balance - end.balance == pytest.approx(spent["cost"], abs=1e-9)
        assert end.balance == pytest.approx(spent["last_balance"], abs=1e-9)

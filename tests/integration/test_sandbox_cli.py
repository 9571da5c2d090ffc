"""The sandbox's command line: the ledger printer, accounts files, the models a key may use,
restarts that keep balances, the stats' time zone, configuration errors, and a log that never
shows a key."""
from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
import requests
import yaml

from service.catalog import ConfigError
from service.credentials import key_fingerprint
from service.sandbox.config import build_parser, config_from_args
from service.sandbox.money import to_micro
from service.sandbox.store import Charge, Store

REPO = Path(__file__).resolve().parents[2]
ACCOUNTS = REPO / "configs" / "sandbox" / "accounts.example.yaml"
LEDGER_FIELDS = {"request_id", "key_id", "model", "prompt_tokens", "total_tokens", "cost_rub",
                 "balance_after", "input_sha256", "created_at"}


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.sandbox", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60)


def _get(sb, key: str, what: str) -> dict:
    return requests.get(f"{sb.base_url}/service/{what}", headers={"Authorization": f"Bearer {key}"},
                        timeout=10).json()


def _embed(sb, key: str, text: str, model: str = "text-embedding-3-small") -> requests.Response:
    return requests.post(sb.base_url + "/embeddings", headers={"Authorization": f"Bearer {key}"}, timeout=10,
                         json={"model": model, "input": text})


def test_ledger_command_prints_one_json_object_per_charge(sandbox):
    for i in range(3):
        assert _embed(sandbox, "sk-test-key", f"text {i}").status_code == 200
    out = _run("ledger", "--db", sandbox.db)
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(rows) == 3 and all(set(r) == LEDGER_FIELDS for r in rows)
    assert rows == sandbox.ledger()


def test_ledger_command_on_a_missing_db_fails_clearly(tmp_path):
    out = _run("ledger", "--db", str(tmp_path / "none.db"))
    assert out.returncode == 2 and "no such database" in out.stderr


@pytest.mark.parametrize("args,message", [
    (["--key", "sk-secret-1"], "--key needs --balance"),
    (["--balance", "5"], "--balance/--budget need --key"),
    ([], "no API key"),
    (["--key", "sk-secret-1", "--balance", "5", "--token-skew", "nope=2"], "--token-skew"),
    (["--key", "sk-secret-1", "--balance", "5", "--rate-500", "0.7", "--rate-502", "0.7"], "sum to at most 1"),
    (["--key", "sk-secret-1", "--balance", "5", "--tz", "Mars/Olympus"], "unknown time zone"),
    (["--key", "sk-secret-1", "--balance", "-1"], "non-negative"),
    (["--key", "sk-secret-1", "--balance", "1", "--faults", "/no/such.yaml"], "cannot read"),
], ids=["key without balance", "balance without key", "no key", "bad skew", "rates over 1", "bad tz",
        "negative balance", "missing profile"])
def test_configuration_errors_say_what_is_wrong_without_the_key(args, message):
    with pytest.raises(ConfigError) as err:
        config_from_args(build_parser().parse_args(["--db", "x.db", *args]))
    assert message in str(err.value) and "sk-secret-1" not in str(err.value)


def test_a_configuration_error_exits_2(tmp_path):
    out = _run("--db", str(tmp_path / "x.db"), "--port", "0", "--key", "sk-secret-1")
    assert out.returncode == 2 and "--key needs --balance" in out.stderr
    assert "sk-secret-1" not in out.stderr + out.stdout


def test_accounts_file_keys_share_their_account(sandbox_factory):
    sb = sandbox_factory(key="sk-flag", balance=2.0, args=["--accounts", str(ACCOUNTS)])
    main, capped, other = "sk-sandbox-team-a-main", "sk-sandbox-team-a-capped", "sk-sandbox-team-b"
    assert _get(sb, main, "balance") == {"balance": 1000.0}
    assert _get(sb, capped, "balance") == {"balance": 1000.0, "budget": 5.0}
    cost = to_micro(_embed(sb, capped, "paid by the capped key").json()["usage"]["cost_rub"])
    assert to_micro(_get(sb, main, "balance")["balance"]) == to_micro(1000.0) - cost
    assert to_micro(_get(sb, capped, "balance")["budget"]) == to_micro(5.0) - cost
    assert to_micro(_get(sb, main, "stats")["daily_usage"]) == cost
    assert _get(sb, other, "balance") == {"balance": 0.05} and _get(sb, other, "stats")["daily_usage"] == 0
    assert _get(sb, "sk-flag", "balance") == {"balance": 2.0}   # --key's own "default" account
    assert {r["key_id"] for r in sb.ledger()} == {key_fingerprint(capped)}


def test_a_key_limited_to_some_models_gets_403_for_the_others(sandbox_factory):
    # the example file's key may use text-embedding-3-small only; --key-models limits --key
    sb = sandbox_factory(key="sk-flag", balance=2.0, args=["--accounts", str(ACCOUNTS),
                                                           "--key-models", "text-embedding-3-large"])
    small, large = "text-embedding-3-small", "text-embedding-3-large"
    for key, allowed, refused in (("sk-sandbox-team-a-small-only", small, large), ("sk-flag", large, small)):
        ok = _embed(sb, key, "an allowed model", allowed)
        assert ok.status_code == 200, ok.text
        before = (_get(sb, key, "balance"), _get(sb, key, "stats"))   # the account endpoints stay open
        charges = len(sb.ledger())
        no = _embed(sb, key, "a model this key may not use", refused)
        assert no.status_code == 403
        assert no.json() == {"error": {"code": "model_not_allowed", "type": "permission_error",
                                       "message": f"The model '{refused}' is not allowed for this API key."}}
        assert key not in no.text
        assert (_get(sb, key, "balance"), _get(sb, key, "stats")) == before   # nothing charged
        assert len(sb.ledger()) == charges
        assert _embed(sb, key, "unknown", "no-such-model").json()["error"]["code"] == "model_not_found"
    assert [r["model"] for r in sb.ledger()] == [small, large]
    assert _embed(sb, "sk-sandbox-team-a-main", "every model", large).status_code == 200   # no `models`


@pytest.mark.parametrize("models,message", [
    (["text-embedding-3-small", "text-embedding-9-huge"], "unknown model 'text-embedding-9-huge'"),
    ("text-embedding-3-small", "must be a non-empty list of model ids"),
    ([], "must be a non-empty list of model ids"),
    ([3], "must be a non-empty list of model ids"),
], ids=["unknown model", "not a list", "empty", "not a string"])
def test_a_key_s_models_must_be_catalogue_ids(tmp_path, models, message):
    accounts = tmp_path / "accounts.yaml"
    accounts.write_text(yaml.safe_dump({"accounts": {"team": {"balance": 1.0, "keys": [
        {"key": "sk-secret-1"}, {"key": "sk-secret-2", "models": models}]}}}))
    with pytest.raises(ConfigError) as err:
        config_from_args(build_parser().parse_args(["--db", "x.db", "--accounts", str(accounts)]))
    assert "account 'team': keys[1].models" in str(err.value) and message in str(err.value)
    assert "sk-secret" not in str(err.value)


@pytest.mark.parametrize("args,message", [
    (["--key", "sk-secret-1", "--balance", "1", "--key-models", "text-embedding-3-small,nope"],
     "--key-models: unknown model 'nope'"),
    (["--key-models", "text-embedding-3-small"], "--key-models needs --key"),
], ids=["unknown model", "without --key"])
def test_key_models_flag_errors(args, message):
    with pytest.raises(ConfigError, match=message) as err:
        config_from_args(build_parser().parse_args(["--db", "x.db", *args]))
    assert "sk-secret-1" not in str(err.value)


def test_a_restart_keeps_balances_and_budgets(sandbox_factory, tmp_path):
    db = tmp_path / "keep.db"
    first = sandbox_factory(db=db, key="sk-k", balance=10.0, budget=4.0)
    cost = to_micro(_embed(first, "sk-k", "spend something").json()["usage"]["cost_rub"])
    first.stop()
    second = sandbox_factory(db=db, key="sk-k", balance=500.0, budget=400.0)   # initial values ignored
    assert to_micro(_get(second, "sk-k", "balance")["balance"]) == to_micro(10.0) - cost
    assert to_micro(_get(second, "sk-k", "balance")["budget"]) == to_micro(4.0) - cost


def _stats_case(db: Path, key: str, now: dt.datetime) -> dict[dt.datetime, int]:
    """Charges at chosen instants, each a distinct power of two in micro-RUB."""
    instants = {now - dt.timedelta(days=40): 1, now - dt.timedelta(days=30, hours=12): 2,
                now - dt.timedelta(days=29): 4, now - dt.timedelta(hours=30): 8,
                now - dt.timedelta(hours=20): 16, now - dt.timedelta(hours=11): 32,
                now - dt.timedelta(hours=3): 64, now - dt.timedelta(minutes=1): 128}
    for when, micro in sorted(instants.items()):
        store = Store(str(db), clock=lambda when=when: when)
        store.ensure_account("default", 10**9)
        store.ensure_key(key_fingerprint(key), "default", None)
        assert store.charge(Charge(f"past-{micro}", key_fingerprint(key), "text-embedding-3-small",
                                   1, 1, micro, ["00"])).ok
        store.close()
    return instants


@pytest.mark.parametrize("tz", ["Pacific/Kiritimati", "America/Adak"])   # UTC+14; UTC-10 with DST
def test_stats_windows_follow_the_time_zone(sandbox_factory, tmp_path, tz):
    db = tmp_path / "tz.db"
    now = dt.datetime.now(dt.UTC)
    instants = _stats_case(db, "sk-tz", now)
    sb = sandbox_factory(db=db, key="sk-tz", balance=1.0, args=["--tz", tz])
    stats = _get(sb, "sk-tz", "stats")

    def expected(at: dt.datetime) -> tuple[int, int]:
        # calendar days in TZ: today, and today plus the 30 days before it
        today = at.astimezone(ZoneInfo(tz)).date()
        days = {when: (today - when.astimezone(ZoneInfo(tz)).date()).days for when in instants}
        return (sum(m for w, m in instants.items() if days[w] == 0),
                sum(m for w, m in instants.items() if days[w] <= 30))

    got = (to_micro(stats["daily_usage"]), to_micro(stats["monthly_usage"]))
    assert got in (expected(now), expected(dt.datetime.now(dt.UTC)))   # midnight may pass
    assert got[1] & 1 == 0 and got[1] & 4 and got[0] & 128   # 40 days out, 29 days in, a minute ago in


def test_the_log_never_shows_a_key(sandbox_factory):
    sb = sandbox_factory(key="sk-very-secret-value", balance=1.0, args=["--log-level", "DEBUG"])
    _embed(sb, "sk-very-secret-value", "hello")
    _embed(sb, "sk-wrong-secret-value", "hello")
    _get(sb, "sk-very-secret-value", "balance")
    sb.stop()
    log = Path(sb.log_path).read_text()
    assert "serving http://" in log and key_fingerprint("sk-very-secret-value") in log
    assert "secret-value" not in log

"""The job under service faults (quick versions; tests/soak/ has the long one):

(a) the key is revoked mid-run (401): exit 1 at once, the rest pending, nothing more sent;
(b) the balance runs out mid-run (402): exit 4, the rest pending, and a resume pays no text twice;
(c) a seeded mix of 5xx, 429, resets and slow answers: exit 0, the same vectors as a clean run,
    rows summing to requests, and what the service billed for abandoned attempts named;
(d) the service restarts mid-run on the same database: the job rides it out, or stops cleanly;
(e) the service dies for good mid-run: exit 1, the rest pending, a clear message.
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import random
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import WORDS_EN, WORDS_RU, ledger, paragraph, read_kind, run, summary

MODEL = "text-embedding-3-small"
REPO = Path(__file__).resolve().parents[2]
MAX_IN_FLIGHT = 2
PER_REQUEST = 4


def write_docs(path: Path, n: int, seed: int = 1) -> list[str]:
    """N short distinct documents (one chunk each): N / PER_REQUEST requests."""
    rng = random.Random(seed)
    ids = [f"doc-{i:04d}" for i in range(n)]
    texts = [f"{i}. " + paragraph(rng, WORDS_EN + WORDS_RU, 12 + i % 7) for i in range(n)]
    pq.write_table(pa.table({"id": ids, "text": texts}), path)
    return ids


def models_config(directory: Path) -> Path:
    """configs/models.yaml with a small request cap, so a small corpus needs many requests."""
    doc = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    doc["models"][MODEL]["max_inputs_per_request"] = PER_REQUEST
    path = directory / "models.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def run_config(directory: Path, **client) -> Path:
    doc = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    doc["client"].update({"initial_backoff_s": 0.05, "max_backoff_s": 0.5, **client})
    path = directory / "pipeline.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Records(logging.Handler):
    """Every log record of a run (module-scoped fixtures cannot use caplog)."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)

    def errors(self) -> list[str]:
        return [r.getMessage() for r in self.records if r.levelno >= logging.ERROR]


@contextlib.contextmanager
def captured_logs():
    handler, root = Records(), logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)


def job(directory: Path, sandbox, corpus: Path, out: Path, *extra: str) -> int:
    return run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sandbox.base_url,
               "--models-config", str(models_config(directory)), "--max-in-flight", str(MAX_IN_FLIGHT), *extra)


def kinds(out: Path) -> dict[str, list[dict]]:
    return {k: (t.to_pylist() if (t := read_kind(out, k)) is not None else [])
            for k in ("embeddings", "failed", "pending", "requests")}


def assert_each_once(found: dict, ids: list[str]) -> None:
    """One chunk per document here: each id in exactly one of embeddings / failed / pending."""
    seen = collections.Counter(r["doc_id"] for k in ("embeddings", "failed", "pending") for r in found[k])
    assert sorted(seen) == sorted(ids) and set(seen.values()) == {1}, \
        {d: c for d, c in seen.items() if c != 1} or set(ids) ^ set(seen)


def assert_outputs_whole(out: Path) -> None:
    """No temporary leftovers, and every Parquet file reads."""
    assert not [p.name for p in out.iterdir() if p.name.startswith(("beam-temp", ".")) or ".tmp" in p.name]
    for path in out.glob("*.parquet"):
        pq.read_table(path)


def micro(values) -> int:
    return sum(round(v * 1e6) for v in values)


def embeddings_by_chunk(rows) -> dict[tuple, np.ndarray]:
    return {(r["doc_id"], r["chunk_index"], r["token_start"]): np.asarray(r["embedding"], np.float32) for r in rows}


def sandbox_requests(sandbox) -> list[tuple[str, int]]:
    """(path, status) of every API request, in the order the sandbox answered them (DEBUG log)."""
    found = []
    for line in Path(sandbox.log_path).read_text().splitlines():
        if '"POST /v1/' in line or '"GET /v1/' in line:
            request, status = line.split('"')[1], line.split('"')[2].split()[0]
            found.append((request.split()[1], int(status)))
    return found


# -- (a) the key is revoked mid-run ------------------------------------------------------------

REVOKE_AFTER = 10


@pytest.fixture(scope="module")
def revoked(tmp_path_factory):
    d = tmp_path_factory.mktemp("revoked")
    ids = write_docs(d / "corpus.parquet", 30 * PER_REQUEST)
    sb = SandboxProcess(d / "sandbox.db", key=SANDBOX_KEY, balance=1000.0,
                        args=["--revoke-after", str(REVOKE_AFTER), "--log-level", "DEBUG"]).start()
    try:
        with pytest.MonkeyPatch.context() as mp, captured_logs() as logs:
            mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
            started = time.monotonic()
            code = job(d, sb, d / "corpus.parquet", d / "out")
            elapsed = time.monotonic() - started
    finally:
        sb.stop()
    print(f"\nrevoked key: exit {code} after {elapsed:.1f} s")
    return code, d / "out", ids, sb, logs


def test_revoked_key_stops_the_run_with_one_clear_message(revoked):
    code, out, ids, _, logs = revoked
    assert code == 1
    assert not any("Traceback" in (r.exc_text or "") or r.exc_info for r in logs.records
                   if r.name.startswith(("embedpipe", "pipeline", "transforms")))
    # One message says what to do (a cause line from the worker may precede it).
    advice = [m for m in logs.errors() if "EMBEDDINGS_API_KEY" in m or "--resume" in m]
    assert len(advice) == 1, logs.errors()
    assert "401" in advice[0] or "unauthorized" in advice[0]


def test_revoked_key_leaves_the_rest_pending_and_sends_nothing_more(revoked):
    code, out, ids, sb, _ = revoked
    found = kinds(out)
    assert_each_once(found, ids)
    assert found["failed"] == []
    assert {r["reason"] for r in found["pending"]} == {"unauthorized"}
    statuses = collections.Counter(r["status"] for r in found["requests"])
    assert set(statuses) == {200, 401}
    # The sandbox counts a request after letting it in, so one racing the revocation may pass.
    assert REVOKE_AFTER <= statuses[200] <= REVOKE_AFTER + MAX_IN_FLIGHT - 1
    assert len(found["embeddings"]) == statuses[200] * PER_REQUEST
    assert sorted(r["request_id"] for r in found["requests"] if r["status"] == 200) == \
        sorted(c["request_id"] for c in ledger(sb.db))
    # Nothing is sent once a 401 is seen: the 401s are the requests that were in flight.
    posts = [status for path, status in sandbox_requests(sb) if path == "/v1/embeddings"]
    assert len(posts) == len(found["requests"])
    after = posts[posts.index(401) + 1:]
    print(f"embeddings requests answered after the first 401: {len(after)} {after} "
          f"(max in flight {MAX_IN_FLIGHT})")
    assert statuses[401] <= MAX_IN_FLIGHT and len(after) <= MAX_IN_FLIGHT
    assert_outputs_whole(out)


def test_revoked_key_run_still_writes_its_summary(revoked):
    code, out, ids, _, _ = revoked
    assert (out / "summary.json").exists()
    s = summary(out)
    embedded = len(kinds(out)["embeddings"])
    assert s["exit_code"] == 1 and s["pending_reasons"] == {"unauthorized": len(ids) - embedded}
    assert s["embedded"] == embedded
    assert not (out / "_journal").exists()


# -- (b) the balance runs out mid-run ------------------------------------------------------------

@pytest.fixture(scope="module")
def broke(tmp_path_factory):
    """A run whose balance runs out mid-way (402), then --resume once topped up."""
    d = tmp_path_factory.mktemp("broke")
    ids = write_docs(d / "corpus.parquet", 30 * PER_REQUEST)
    out, db = d / "out", d / "sandbox.db"
    # --precheck refuses (402) once the balance is below a request's estimate at the model's
    # maximum context (4 x 8191 tokens = 0.08191 RUB), as production does; the whole corpus
    # costs ~0.01 RUB, so the run's own preflight sees it fit.
    estimate = PER_REQUEST * 8191 * 2.5e-6
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        with SandboxProcess(db, key=SANDBOX_KEY, balance=round(estimate + 0.0025, 6), args=["--precheck"]) as sb:
            code = job(d, sb, d / "corpus.parquet", out)
        first = kinds(out), summary(out), ledger(db)
        # Topped up (the same database without the pre-check): --resume sends only what is left.
        with SandboxProcess(db, key=SANDBOX_KEY, balance=1.0) as sb:
            resumed = job(d, sb, d / "corpus.parquet", out, "--resume")
    return ids, code, first, resumed, out, db


def test_balance_running_out_mid_run_exits_4_with_the_rest_pending(broke):
    ids, code, (found, s, charges), _, _, _ = broke
    assert code == 4
    assert_each_once(found, ids)
    assert found["embeddings"] and found["pending"] and found["failed"] == []
    assert "insufficient_balance" in {r["reason"] for r in found["pending"]}
    assert collections.Counter(r["status"] for r in found["requests"])[402] >= 1
    assert s["exit_code"] == 4 and s["reconciliation"]["balance_minus_requests_rub"] == 0
    assert micro(c["cost_rub"] for c in charges) == micro(r["cost_rub"] for r in found["requests"]) \
        == micro(r["cost_rub"] for r in found["embeddings"])
    sent = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert set(sent.values()) == {1}


def test_balance_running_out_marks_the_rest_insufficient_balance(broke):
    _, _, (found, s, _), _, _, _ = broke
    assert {r["reason"] for r in found["pending"]} == {"insufficient_balance"}
    assert s["pending_reasons"] == {"insufficient_balance": len(found["pending"])}


def test_resume_after_402_pays_for_no_text_twice(broke):
    ids, _, _, resumed, out, db = broke
    assert resumed == 0
    sent = collections.Counter(h for c in ledger(db) for h in c["input_sha256"])
    assert len(sent) == len(ids) and set(sent.values()) == {1}  # every text paid for exactly once
    delivered = collections.Counter(r["doc_id"] for r in read_kind(out, "embeddings").to_pylist())
    assert sorted(delivered) == sorted(ids) and set(delivered.values()) == {1}
    assert_outputs_whole(out)


# -- (c) a seeded mix of transient faults ---------------------------------------------------------

FAULTS = ["--seed", "30", "--rate-500", "0.08", "--rate-502", "0.04", "--rate-503", "0.04",
          "--rate-429", "0.06", "--retry-after-s", "1", "--rate-reset", "0.05",
          "--rate-reset-after-charge", "0.05", "--rate-slow", "0.08", "--slow-s", "3"]


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A clean run of the corpus that (c) and (d) use, for their vectors."""
    d = tmp_path_factory.mktemp("clean")
    ids = write_docs(d / "corpus.parquet", 24 * PER_REQUEST, seed=3)
    with SandboxProcess(d / "sandbox.db", key=SANDBOX_KEY, balance=1000.0) as sb, \
            pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        assert job(d, sb, d / "corpus.parquet", d / "out") == 0
    rows = read_kind(d / "out", "embeddings").to_pylist()
    assert len(rows) == len(ids)
    return d / "corpus.parquet", ids, embeddings_by_chunk(rows)


def test_transient_faults_change_nothing_but_the_bill(tmp_path, sandbox_factory, monkeypatch, clean):
    corpus, ids, clean_vectors = clean
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    sb = sandbox_factory(key=SANDBOX_KEY, balance=1000.0, args=FAULTS)
    out = tmp_path / "out"
    started = time.monotonic()
    # A read timeout below --slow-s: slow answers are abandoned (and billed) and retried. 40 % of
    # attempts fail here, so 14 attempts make giving up on a request a 3e-6 event, not a flake.
    code = job(tmp_path, sb, corpus, out, "--run-config",
               str(run_config(tmp_path, read_timeout_s=1.0, max_attempts=14, max_total_s=90.0)))
    elapsed = time.monotonic() - started
    assert code == 0
    found = kinds(out)
    assert_each_once(found, ids)
    assert embeddings_by_chunk(found["embeddings"]).keys() == clean_vectors.keys()
    for key, vector in embeddings_by_chunk(found["embeddings"]).items():
        np.testing.assert_array_equal(vector, clean_vectors[key])
    requests = found["requests"]
    assert micro(r["cost_rub"] for r in found["embeddings"]) == micro(r["cost_rub"] for r in requests)
    charges = ledger(sb.db)
    answered = {r["request_id"] for r in requests}
    extra_micro = micro(c["cost_rub"] for c in charges) - micro(r["cost_rub"] for r in requests)
    with urllib.request.urlopen(f"http://127.0.0.1:{sb.port}/healthz", timeout=10) as resp:
        injected = {k: v for k, v in json.load(resp)["faults_injected"].items() if v}
    retries = sum(r["attempts"] - 1 for r in requests)
    print(f"\nfault mix: {elapsed:.1f} s, {len(requests)} requests, {retries} retries, "
          f"{len(charges)} charges, extra billed {extra_micro / 1e6:.6f} RUB; injected {injected}")
    assert retries > 0
    # Every charge belongs to a request of the run; the ones beyond one per request are the
    # abandoned attempts (slow answers, resets after charging) that the service still billed.
    assert {c["request_id"] for c in charges} == answered
    assert extra_micro > 0, "the seed should give at least one billed-then-abandoned attempt"
    recon = summary(out)["reconciliation"]
    assert recon["rows_minus_requests_rub"] == 0
    assert round(recon["balance_minus_requests_rub"] * 1e6) == extra_micro
    # every abandoned attempt is named: billed for a retried request whose answer never arrived
    assert round(recon["lost"]["rub"] * 1e6) == extra_micro and recon["lost"]["retried"]["count"] > 0
    assert recon["others_rub"] == 0 and recon["unexplained_rub"] == 0, recon["notes"]
    assert injected.get("slow") and injected.get("reset_after_charge")  # seed 30 draws both early


# -- (d) the service restarts mid-run -------------------------------------------------------------

def test_service_restart_mid_run(tmp_path, sandbox_factory, monkeypatch, clean):
    corpus, ids, clean_vectors = clean
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
    db = tmp_path / "sandbox.db"
    sb = sandbox_factory(db=db, key=SANDBOX_KEY, balance=1000.0, args=["--latency-ms", "60"])
    restarted = threading.Event()

    def restart_after_a_few_charges():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(ledger(db)) < 5:
            time.sleep(0.02)
        sb.restart()
        restarted.set()

    thread = threading.Thread(target=restart_after_a_few_charges, daemon=True)
    out = tmp_path / "out"
    with captured_logs() as logs:
        thread.start()
        code = job(tmp_path, sb, corpus, out)
        thread.join(60)
    assert restarted.is_set() and sb.running()
    found = kinds(out)
    assert_each_once(found, ids)
    assert_outputs_whole(out)
    assert not any(r.exc_info for r in logs.records if r.name.startswith(("embedpipe", "pipeline")))
    charges = ledger(db)
    retries = sum(r["attempts"] - 1 for r in found["requests"])
    print(f"\nrestart: exit {code}, {len(found['requests'])} requests, {retries} retries, "
          f"{len(charges)} charges")
    if code == 0:
        assert len(found["embeddings"]) == len(ids)
        for key, vector in embeddings_by_chunk(found["embeddings"]).items():
            np.testing.assert_array_equal(vector, clean_vectors[key])
        recon = summary(out)["reconciliation"]
        assert recon["rows_minus_requests_rub"] == 0
        extra = micro(c["cost_rub"] for c in charges) - micro(r["cost_rub"] for r in found["requests"])
        assert round(recon["balance_minus_requests_rub"] * 1e6) == extra >= 0
    else:  # out of retry budget: a clear stop, the rest pending and resumable
        assert code == 1
        assert {r["reason"] for r in found["pending"]} == {"service_unavailable"}
        assert any("--resume" in m for m in logs.errors())


# -- (e) the service dies for good mid-run ----------------------------------------------------------

@pytest.fixture(scope="module")
def dead(tmp_path_factory):
    d = tmp_path_factory.mktemp("dead")
    ids = write_docs(d / "corpus.parquet", 30 * PER_REQUEST, seed=4)
    sb = SandboxProcess(d / "sandbox.db", key=SANDBOX_KEY, balance=1000.0, args=["--latency-ms", "60"]).start()

    def kill_after_a_few_charges():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(ledger(d / "sandbox.db")) < 5:
            time.sleep(0.02)
        sb.kill()

    killer = threading.Thread(target=kill_after_a_few_charges, daemon=True)
    try:
        with pytest.MonkeyPatch.context() as mp, captured_logs() as logs:
            mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
            killer.start()
            started = time.monotonic()
            code = job(d, sb, d / "corpus.parquet", d / "out", "--run-config",
                       str(run_config(d, max_attempts=3, max_total_s=3.0, connect_timeout_s=1.0)))
            elapsed = time.monotonic() - started
            killer.join(60)
    finally:
        sb.kill()
    print(f"\ndead service: exit {code} after {elapsed:.1f} s")
    return code, d / "out", ids, ledger(d / "sandbox.db"), logs


def test_dead_service_stops_the_run_with_the_rest_pending(dead):
    code, out, ids, charges, logs = dead
    assert code == 1
    found = kinds(out)
    assert_each_once(found, ids)
    assert found["failed"] == [] and found["pending"]
    assert {r["reason"] for r in found["pending"]} == {"service_unavailable"}
    delivered = {r["request_id"] for r in found["requests"] if r["status"] == 200}
    assert delivered <= {c["request_id"] for c in charges}  # nothing delivered that was not billed
    assert micro(r["cost_rub"] for r in found["embeddings"]) == micro(
        r["cost_rub"] for r in found["requests"] if r["status"] == 200)
    assert_outputs_whole(out)
    assert not any(r.exc_info for r in logs.records if r.name.startswith(("embedpipe", "pipeline")))
    assert logs.errors() and any("ConnectionRefused" in m or "Connection refused" in m for m in logs.errors())


def test_dead_service_run_still_writes_its_summary(dead):
    code, out, ids, _, logs = dead
    assert [m for m in logs.errors() if "--resume" in m], logs.errors()
    assert (out / "summary.json").exists()
    s = summary(out)
    assert s["exit_code"] == 1 and set(s["pending_reasons"]) == {"service_unavailable"}
    assert s["balance_after"] is None  # unknown, and said so rather than invented

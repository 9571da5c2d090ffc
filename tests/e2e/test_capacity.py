"""The job against a service with a capacity (the sandbox's --capacity): in 429 mode the limiter
meets the refusals, and the run still delivers every row exactly as a run without limits does,
paying for nothing twice, with one worker process and with two; in queue mode too. Figures
(429 counts, the limits reached) are measured by `make bench`, not asserted here."""
from __future__ import annotations

import collections
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import requests
import yaml

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import current_files, current_rows, ledger, run, summary
from tests.e2e.test_faults import MODEL, PER_REQUEST, models_config, run_config, write_docs

DOCS = 24 * PER_REQUEST   # 24 requests


@pytest.fixture(scope="module")
def unlimited(tmp_path_factory):
    """The rows of a run against a service without a capacity: what every other run must match."""
    tmp = tmp_path_factory.mktemp("unlimited")
    write_docs(tmp / "c.parquet", DOCS)
    return _job(tmp, [])[0]


def _job(tmp, sandbox_args, *job_args, rate_limits=None, embed=None, client=None, beside=None):
    """BESIDE: another client that also uses the account while the job runs."""
    from service.sandbox.launcher import SandboxProcess  # a module fixture cannot use sandbox_factory
    corpus, out = tmp / "c.parquet", tmp / "out"
    if not corpus.exists():
        write_docs(corpus, DOCS)
    with SandboxProcess(tmp / "sb.db", key=SANDBOX_KEY, balance=10.0,
                        args=["--latency-ms", "150", *sandbox_args]) as sb:
        if beside:
            beside.begin(sb.base_url)
        try:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
                code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                           "--models-config", str(models_config(tmp)),
                           "--run-config", str(_config(tmp, rate_limits, embed, client)),
                           *job_args)
        finally:
            if beside:
                beside.end()
        assert code == 0
        charges = ledger(sb.db)
    rows = {(r["doc_id"], r["chunk_index"]): (r["text_sha256"], r["embedding"])
            for r in current_rows(out, "embeddings")}
    return rows, charges, summary(out)


def _config(tmp, rate_limits, embed=None, client=None):
    path = run_config(tmp)
    doc = yaml.safe_load(path.read_text())
    doc["rate_limits"].update(rate_limits or {})
    doc["embed"].update(embed or {})
    doc["client"].update(client or {})
    path.write_text(yaml.safe_dump(doc))
    return path


def _sent_before_the_first_answer(out) -> int:
    t = pa.concat_tables([pq.read_table(f, columns=["started_at", "latency_ms"])
                          for f in current_files(out, "requests")])
    starts = [s.timestamp() for s in t["started_at"].to_pylist()]
    first_answer = min(s + ms / 1000 for s, ms in zip(starts, t["latency_ms"].to_pylist(), strict=True))
    return sum(s < first_answer for s in starts)


@pytest.mark.parametrize("admitted_after_s, sent", [(0.25, (4, 8)), pytest.param(1000.0, (2, 2), marks=pytest.mark.soak)])
def test_before_a_slow_first_answer_the_limit_grows_while_nothing_is_refused(tmp_path, admitted_after_s, sent):
    """A 2 s first answer: requests out for embed.admitted_after_s without a 429 let the next one
    go (up to 4 x the initial 2); with the ramp out of reach, only the initial 2 leave."""
    write_docs(tmp_path / "c.parquet", 8 * PER_REQUEST)
    rows, charges, s = _job(tmp_path, ["--latency-ms", "2000"], embed={"admitted_after_s": admitted_after_s})
    assert len(rows) == 8 * PER_REQUEST and len(charges) == s["requests"] == 8
    low, high = sent
    assert low <= _sent_before_the_first_answer(tmp_path / "out") <= high


@pytest.mark.parametrize("mode, workers", [("429", 1), pytest.param("429", 2, marks=pytest.mark.soak), ("queue", 1)])
def test_a_service_at_capacity_gets_every_row_paid_once(tmp_path, unlimited, mode, workers):
    extra = ("--direct_num_workers", "2", "--direct_running_mode", "multi_processing") if workers > 1 else ()
    rows, charges, s = _job(tmp_path, ["--capacity", "2", "--capacity-mode", mode], *extra)
    assert rows == unlimited                                    # the same rows, the same vectors
    paid = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert len(paid) == DOCS and max(paid.values()) == 1         # nothing paid twice
    assert s["requests"] == len(charges) and s["pending"] == 0 and s["failed"] == 0
    print(f"\ncapacity 2, {mode}, {workers} worker(s): {s['requests']} requests, "
          f"{s['metrics'].get('retries', 0)} retries")


@pytest.mark.soak   # slow: make soak
def test_more_processes_than_places_deliver_every_row_and_keep_sending(tmp_path, unlimited):
    """Two processes on one place: the one kept out has requests refused until their retries
    run out (client.max_refusals 0 here: at the first 429). That tripped its breaker as if the
    service were gone: 92 of 96 rows were left pending. A refusing service is busy, not gone,
    so such a request is sent again while the process had an answer within
    embed.max_refused_s."""
    rows, charges, s = _job(tmp_path, ["--capacity", "1", "--capacity-mode", "429"],
                            "--direct_num_workers", "2", "--direct_running_mode", "multi_processing",
                            client={"max_refusals": 0})
    assert rows == unlimited
    paid = collections.Counter(h for c in charges for h in c["input_sha256"])
    assert len(paid) == DOCS and max(paid.values()) == 1
    assert s["pending"] == 0 and s["failed"] == 0 and s["metrics"].get("rate_limited", 0) > 0


class _OtherClient:
    """Another client of the same account, a request of the job's size at a time: it spends
    until it has seen the job spend (the balance after its answers falling by more than its
    own costs) in JOB_SEEN of its answers, then stops."""

    def __init__(self, job_seen: int):
        self.job_seen, self.seen, self.error = job_seen, 0, None
        self.texts = [f"another client's text {i}, " + "words " * 20 for i in range(PER_REQUEST)]
        self._stop = threading.Event()

    def begin(self, base_url: str) -> None:
        self.url = f"{base_url}/embeddings"
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def end(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self):
        try:
            with requests.Session() as session:
                session.trust_env = False   # loopback: no proxy
                last = None
                while not self._stop.is_set() and self.seen < self.job_seen:
                    resp = session.post(self.url, json={"model": MODEL, "input": self.texts}, timeout=30,
                                        headers={"Authorization": f"Bearer {SANDBOX_KEY}"})
                    if resp.status_code == 429:
                        time.sleep(0.05)
                        continue
                    resp.raise_for_status()
                    usage = resp.json()["usage"]
                    self.seen += last is not None and last - usage["balance"] > usage["cost_rub"] + 1e-6
                    last = usage["balance"]
        except Exception as exc:   # reported by the test, not lost in a thread
            self.error = exc


@pytest.mark.soak   # slow: make soak
def test_the_process_left_alone_on_the_account_takes_the_places_back(tmp_path):
    """Another client holds one of the account's 2 places while the job starts, then stops: the
    job's 429s taught it a level while the other spent, and the balance its answers carry tells
    it when nobody else spends any more (others_left); every row is still delivered, once."""
    n, other = 64 * PER_REQUEST, _OtherClient(job_seen=12)
    write_docs(tmp_path / "c.parquet", n)
    rows, charges, s = _job(tmp_path, ["--capacity", "2", "--capacity-mode", "429"], beside=other)
    assert other.error is None and other.seen == 12   # it did share the account with the job
    assert len(rows) == n and s["pending"] == 0 and s["failed"] == 0
    assert s["metrics"].get("others_left", 0) >= 1


def test_a_known_quota_is_kept_without_429s(tmp_path, unlimited):
    """rate_limits.requests_per_minute below the service's rate: the adaptive limit never meets a
    429, because the token bucket paces the requests first."""
    rows, charges, s = _job(tmp_path, ["--embeddings-rps", "6", "--embeddings-burst", "6"],
                            rate_limits={"requests_per_minute": 300})
    assert rows == unlimited and len(charges) == s["requests"]
    assert s["metrics"].get("retries", 0) == 0 and s["metrics"].get("rate_limited", 0) == 0
    assert s["metrics"].get("others_left", 0) == 0   # alone on the account all along: never news

"""Faults across processes, on Prism: the worker pool killed mid-run, Prism's own process killed,
the launcher killed while Prism runs. Each run fails promptly in one line (exit 1) or, for the
launcher, leaves nothing running; the same command with --resume then completes, and the only
texts paid twice are those of requests that were in flight at the kill, which summary.json names
(reconciliation.lost.in_flight, matched to the micro-rouble against the sandbox's ledger).

A job service of its own (a cluster's) is another matter: the launcher killed, the job goes on
to its end there, and the resume after it pays for nothing again."""
from __future__ import annotations

import collections
import json
import os
import signal
import time

import pytest

from tests.e2e.money_helpers import assert_every_row_once, corpus_rows, wait_for_journal, write_corpus, write_models
from tests.prism.twin import Side, env_for, wait_until

MODEL = "text-embedding-3-small"
LATENCY_MS = 150      # requests stay in flight long enough to be killed in flight
KILL_AFTER = 4        # answers journaled before the kill


class Job:
    """A run of many small requests on Prism: started, killed, resumed."""

    def __init__(self, tmp_path, sandbox_factory, key: str, flags: list[str], scanned=dict, pool=None):
        self.models = write_models(tmp_path / "models.yaml")
        self.rows = corpus_rows(n_short=160, n_long=3)
        self.corpus = write_corpus(tmp_path / "corpus.parquet", self.rows)
        sandbox = sandbox_factory(key=key, balance=100.0,
                                  args=["--models", str(self.models), "--latency-ms", str(LATENCY_MS)])
        env = pool.launcher_env(env_for(key)) if pool else env_for(key)   # a pool: found by its POOL_DIR
        self.side = Side("prism", tmp_path / "side", sandbox, flags, env, scanned, key)
        self.log = tmp_path / "killed-run.log"

    def args(self, *more: str) -> list[str]:
        return ["--input", str(self.corpus), "--output", "{out}", "--model", MODEL, "--base-url", "{base_url}",
                "--models-config", str(self.models), "--max-in-flight", "2", *more]

    def start(self):
        proc = self.side.start("run", *self.args(), log=self.log)
        wait_for_journal(proc, self.side.out, KILL_AFTER, self.log)
        return proc

    def ended(self, proc) -> tuple[int, str, float]:
        """(exit code, output, seconds from now until it exited)."""
        started = time.monotonic()
        code = proc.wait(120)
        return code, self.log.read_text(), time.monotonic() - started

    def settle(self) -> None:
        """What the killed run had in flight is billed within the latency."""
        seen = -1
        while len(self.side.ledger()) != seen:
            seen = len(self.side.ledger())
            time.sleep(5 * LATENCY_MS / 1000)

    def resume_and_check(self, in_flight_at_most: int) -> dict:
        """--resume completes; texts paid twice are exactly those of the requests billed without an
        answer, which the reconciliation counts and prices."""
        self.settle()
        outcome = self.side.cli("run", *self.args("--resume"))
        assert outcome.code == 0, outcome.raw_stderr[-3000:]
        assert assert_every_row_once(self.side.out, self.rows)["pending"] == 0
        ledger = self.side.ledger()
        twice = {h for h, n in collections.Counter(h for c in ledger for h in c["input_sha256"]).items() if n > 1}
        answered = {r["request_id"] for r in self._requests()}
        unanswered = [c for c in ledger if c["request_id"] not in answered]
        assert twice == {h for c in unanswered for h in c["input_sha256"]}
        lost = json.loads((self.side.out / "summary.json").read_text())["reconciliation"]
        assert lost["unexplained_rub"] == 0, lost["notes"]
        assert lost["lost"]["in_flight"]["count"] == len(unanswered) <= in_flight_at_most, lost
        assert round(lost["lost"]["in_flight"]["rub"] * 1e6) == sum(round(c["cost_rub"] * 1e6) for c in unanswered)
        print(f"\n{len(unanswered)} requests in flight at the kill, {len(twice)} texts paid twice, named: "
              f"{lost['notes']}")
        return lost

    def _requests(self) -> list[dict]:
        import pyarrow.parquet as pq
        return [r for f in self.side.out.glob("history/*/requests-*.parquet") for r in pq.read_table(f).to_pylist()]


def one_line(output: str, *words: str) -> str:
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "Traceback" not in output, output[-4000:]
    assert all(w in errors[0] for w in words), errors[0]
    return errors[0]


def test_the_pool_killed_mid_run_fails_in_one_line_and_resumes(tmp_path, sandbox_factory, leak_key, own_pool,
                                                               prism_binary):
    pool = own_pool()
    job = Job(tmp_path, sandbox_factory, leak_key, ["--profile", "prism-pool", "--prism_location", prism_binary,
                                                    "--environment_config", pool.address], pool.logs, pool)
    proc = job.start()
    os.killpg(pool.pid, signal.SIGKILL)   # the pool and its workers: a host or a container gone
    code, output, seconds = job.ended(proc)
    print(f"\nthe run ended {seconds:.1f} s after the pool was killed")
    assert code == 1
    line = one_line(output, f"the workers of the worker pool at {pool.address} went away mid-run", "make pool-up",
                    "--resume")
    pool.follow(line, leak_key)   # its workers take the key from the environment of the command it gives
    job.resume_and_check(in_flight_at_most=2)


@pytest.mark.parametrize("variant", ["prism", "prism-pool"])
def test_prism_killed_mid_run_fails_in_one_line_and_resumes(tmp_path, sandbox_factory, leak_key, pool, wrapper,
                                                            variant):
    flags = ["--profile", variant, "--prism_location", str(wrapper.path)]
    flags += ["--environment_config", pool.address] if variant == "prism-pool" else []
    job = Job(tmp_path, sandbox_factory, leak_key, flags, wrapper.logs, pool if variant == "prism-pool" else None)
    proc = job.start()
    os.kill(wrapper.pids()[0], signal.SIGKILL)
    code, output, seconds = job.ended(proc)
    print(f"\nthe run ended {seconds:.1f} s after Prism was killed")
    assert code == 1, output[-3000:]
    one_line(output, "the runner (PrismRunner, started by this command) stopped mid-run", "--resume")
    job.resume_and_check(in_flight_at_most=2)


@pytest.mark.parametrize("variant", ["prism", "prism-pool"])
def test_the_launcher_killed_ends_its_prism_and_the_resume_completes(tmp_path, sandbox_factory, leak_key, pool,
                                                                     wrapper, variant):
    flags = ["--profile", variant, "--prism_location", str(wrapper.path)]
    flags += ["--environment_config", pool.address] if variant == "prism-pool" else []
    job = Job(tmp_path, sandbox_factory, leak_key, flags, wrapper.logs, pool if variant == "prism-pool" else None)
    proc = job.start()
    os.kill(proc.pid, signal.SIGKILL)   # the launcher alone, not its process group
    proc.wait(30)
    wait_until(lambda: not wrapper.running(), 15, "Prism outlived the launcher that started it")
    job.resume_and_check(in_flight_at_most=2)


def test_the_launcher_killed_while_a_job_service_runs_the_job(tmp_path, sandbox_factory, leak_key, job_service,
                                                              own_pool):
    """As on a cluster: the job goes on without its launcher; the resume after it pays nothing twice."""
    pool = own_pool()
    job = Job(tmp_path, sandbox_factory, leak_key, ["--profile", "prism-pool", "--job_endpoint", job_service.endpoint,
                                                    "--environment_config", pool.address], pool.logs, pool)
    proc = job.start()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(30)
    wait_until(lambda: job_service.states() == ["DONE"], 120, f"the job's end ({job_service.states()})")
    lost = job.resume_and_check(in_flight_at_most=0)
    assert lost["lost"]["count"] == 0

"""Soak: a service slower than the client's read timeout, and a queue longer than it, through the
sandbox's own options (--latency-ms, --capacity, --capacity-mode queue), with the ledger as the
truth of what was billed. Latency and timeouts are scaled down together (the run config's
read_timeout_s of a few seconds, the sandbox's latency above it): the mechanism is what is
tested, not the minutes.

    make soak        (pytest -m soak -s: prints the figures)

Whatever happens, no text is billed more than twice in a run; the job finishes by waiting
longer, or stops with exit 1, its pending rows and a message naming the setting to raise, and
never says "nothing is paid twice" after an attempt that may have been billed.
"""
from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
import yaml

from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import ledger, read_kind, run, summary
from tests.e2e.test_faults import MODEL, REPO, write_docs

pytestmark = pytest.mark.soak

SCALE = 1 / 30   # of the defaults: read_timeout_s 60 -> 2, read_timeout_max_s 300 -> 10, max_total_s 120 -> 4


def configs(directory: Path, per_request: int, **client) -> tuple[Path, Path]:
    models = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
    models["models"][MODEL]["max_inputs_per_request"] = per_request
    settings = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
    settings["client"].update({"read_timeout_s": 60 * SCALE, "read_timeout_max_s": 300 * SCALE,
                               "max_total_s": 120 * SCALE, "initial_backoff_s": 0.05, **client})
    (directory / "models.yaml").write_text(yaml.safe_dump(models))
    (directory / "pipeline.yaml").write_text(yaml.safe_dump(settings))
    return directory / "models.yaml", directory / "pipeline.yaml"


def job(sb: SandboxProcess, directory: Path, corpus: Path, out: Path, *extra: str) -> tuple[int, float]:
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        code = run("--input", str(corpus), "--output", str(out), "--model", MODEL, "--base-url", sb.base_url,
                   "--models-config", str(directory / "models.yaml"),
                   "--run-config", str(directory / "pipeline.yaml"), *extra)
    return code, time.monotonic() - started


def billed(charges: list[dict]) -> collections.Counter:
    """How many times each text was billed."""
    return collections.Counter(sha for c in charges for sha in c["input_sha256"])


def settle(sb: SandboxProcess, latency_s: float) -> list[dict]:
    """The ledger once the sandbox has finished (and billed) what the client gave up on."""
    time.sleep(latency_s + 1)
    return ledger(sb.db)


def figures(name: str, code: int, seconds: float, charges: list[dict], s: dict, capsys) -> None:
    twice = sum(n > 1 for n in billed(charges).values())
    rub = sum(c["cost_rub"] for c in charges)
    with capsys.disabled():
        print(f"\n{name}: exit {code} after {seconds:.1f} s, {len(charges)} charges, {rub:.6f} RUB, "
              f"{twice} texts billed twice, {s['timed_out_attempts']} attempts timed out, "
              f"{s['embedded']} embedded, {s['pending']} pending {s['pending_reasons']}")


def test_a_service_slower_than_the_read_timeout_is_waited_for(tmp_path, capsys):
    """--latency-ms above read_timeout_s, below read_timeout_max_s: before the first answer a
    request waits up to the ceiling, and after it 3x what the answers took: each text is paid
    once."""
    latency = 2.5
    configs(tmp_path, per_request=10)
    write_docs(tmp_path / "c.parquet", 50)
    with SandboxProcess(tmp_path / "sb.db", key=SANDBOX_KEY, balance=100.0,
                        args=["--latency-ms", str(int(latency * 1000))]) as sb:
        code, seconds = job(sb, tmp_path, tmp_path / "c.parquet", tmp_path / "out")
        charges = settle(sb, latency)
    s = summary(tmp_path / "out")
    printed = capsys.readouterr().out
    figures("slower than the timeout", code, seconds, charges, s, capsys)
    assert code == 0 and s["embedded"] == 50 and s["pending"] == 0
    counts = billed(charges)
    assert set(counts) == set(read_kind(tmp_path / "out", "embeddings").column("text_sha256").to_pylist())
    assert max(counts.values()) == 1 and s["timed_out_attempts"] == 0
    assert "timed out" not in printed


def test_a_service_slower_than_the_ceiling_stops_early_and_says_what_to_raise(tmp_path, capsys):
    """--latency-ms above read_timeout_max_s: a request times out twice (both may be billed),
    the run stops (exit 1, pending: timed_out) and names client.read_timeout_max_s; raising it
    in the --run-config file, as the message says, lets the same command finish."""
    latency = 12.0
    configs(tmp_path, per_request=10)
    write_docs(tmp_path / "c.parquet", 50)
    out = tmp_path / "out"
    with SandboxProcess(tmp_path / "sb.db", key=SANDBOX_KEY, balance=100.0,
                        args=["--latency-ms", str(int(latency * 1000))]) as sb:
        code, seconds = job(sb, tmp_path, tmp_path / "c.parquet", out)
        first = settle(sb, latency)
        s = summary(out)
        printed = capsys.readouterr().out
        figures("slower than the ceiling", code, seconds, first, s, capsys)
        assert code == 1 and s["pending_reasons"].get("timed_out") and s["embedded"] + s["pending"] == 50
        assert max(billed(first).values()) <= 2 and s["timed_out_attempts"] >= 2
        assert "timed out (may be billed)" in printed
        assert "client.read_timeout_max_s" in printed and "nothing is paid twice" not in printed
        assert "run the same command again with --resume adding --run-config FILE" in printed

        settings = yaml.safe_load((tmp_path / "pipeline.yaml").read_text())   # as the message says
        settings["client"]["read_timeout_max_s"] = 2 * latency
        (tmp_path / "pipeline.yaml").write_text(yaml.safe_dump(settings))
        code, seconds = job(sb, tmp_path, tmp_path / "c.parquet", out, "--resume")
        again = settle(sb, latency)[len(first):]
    s = summary(out)
    figures("after raising it", code, seconds, again, s, capsys)
    assert code == 0 and s["current"]["embedded"] == 50 and s["current"]["pending"] == 0
    assert max(billed(again).values()) == 1


def test_a_queue_longer_than_the_read_timeout_is_not_billed_twice(tmp_path, capsys):
    """--capacity 1 --capacity-mode queue, each request 2 s: before the first answer the limit
    ramps up and the requests queue behind each other, the last one far past read_timeout_s;
    each waits as long as the queue ahead of it can take, and the limit comes down to what the
    latency says fits."""
    latency = 2.0
    configs(tmp_path, per_request=40, read_timeout_s=6.0, read_timeout_max_s=30.0, max_total_s=12.0)
    write_docs(tmp_path / "c.parquet", 400)
    with SandboxProcess(tmp_path / "sb.db", key=SANDBOX_KEY, balance=100.0,
                        args=["--latency-ms", str(int(latency * 1000)), "--capacity", "1",
                              "--capacity-mode", "queue"]) as sb:
        code, seconds = job(sb, tmp_path, tmp_path / "c.parquet", tmp_path / "out")
        charges = settle(sb, latency)
    s = summary(tmp_path / "out")
    figures("a queue of capacity 1", code, seconds, charges, s, capsys)
    assert code == 0 and s["embedded"] == 400
    assert max(billed(charges).values()) <= 2
    assert sum(n > 1 for n in billed(charges).values()) <= 40 * s["timed_out_attempts"]

"""The runners section of `make bench` (--only-runners runs it alone): the same job on the local
runner (FnApiRunner in the launcher), on Prism with LOOPBACK workers (threads of the launcher)
and on Prism with EXTERNAL workers (the processes of a worker pool, tools/pool.py), on one corpus
and zero-latency sandboxes of their own, default settings, in one run.

Each process is measured on its own: the launcher (wall; CPU from os.wait4 less Prism's, which
it waits for), Prism (its CPU and VmHWM, read from /proc while it runs) and the pool's SDK
workers (the same). Prism keeps in memory every PCollection that crosses a stage boundary until
its consumer has read it; on a runner whose workers are not the launcher's threads the job
dedupes by grouping texts by digest (transforms/dedupe/distinct.py GroupDistinctTexts), so
Prism's peak grows with the texts of the run. Two more runs on Prism name that PCollection: the
same job on a tenth of the corpus, and the next day's `--sync` of the whole corpus with nothing
changed, whose Read passes no text on to the grouping (only the documents' digests).
Nothing here asserts speed.
"""
from __future__ import annotations

import json
import os
import shutil
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from pipeline import workerpool
from tests.bench.corpus import SCHEMA, make_documents
from tests.bench.measure import peak_rss_mb, process_cpu_s, run_measured
from tests.bench.report import table
from tests.conftest import free_port
from tools import pool as pools
from tools import prism

MODEL = "text-embedding-3-small"


class Watch:
    """Every process under ROOTS (pids) sampled every 0.1 s while a run goes: per pid, its
    command, its last CPU reading and its peak RSS. A process's CPU is read before it ends, so
    the last 0.1 s of a process may be missing."""

    def __init__(self, roots: list[int], skip: set[int]):
        self.roots, self.skip = roots, skip
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def sample(self) -> None:
        for pid in self._descendants():
            try:
                cpu, rss = process_cpu_s(pid), peak_rss_mb(pid)
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            seen = self.seen.setdefault(pid, {"command": "", "cpu_s": 0.0, "peak_rss_mb": 0.0})
            # the command as it is now (a pool's worker is tools.worker_boot until it execs the worker;
            # an exited one, a zombie, has none)
            seen.update(command=command.strip() or seen["command"], cpu_s=cpu,
                        peak_rss_mb=max(seen["peak_rss_mb"], rss or 0.0))

    def _descendants(self) -> list[int]:
        parents: dict[int, list[int]] = {}
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                try:
                    ppid = int(open(f"/proc/{entry.name}/stat").read().rsplit(")", 1)[1].split()[1])
                except (OSError, IndexError, ValueError):
                    continue
                parents.setdefault(ppid, []).append(int(entry.name))
        found, todo = [], list(self.roots)
        while todo:
            for child in parents.get(todo.pop(), []):
                if child not in self.skip:
                    found.append(child)
                    todo.append(child)
        return found

    def of(self, word: str) -> tuple[float, float]:
        """(CPU s summed, peak RSS MB of the largest) of the processes whose command has WORD."""
        found = [s for s in self.seen.values() if word in s["command"]]
        return sum(s["cpu_s"] for s in found), max((s["peak_rss_mb"] for s in found), default=0.0)


def _measure(bench, env: dict, label: str, corpus: Path, flags: list[str], pool_pid: int | None,
             out: Path | None = None, extra: tuple[str, ...] = ()) -> list:
    """One run, measured per process: the table's row."""
    output = out or bench.work / "runners" / f"out-{label}"
    if out is None:
        shutil.rmtree(output, ignore_errors=True)
    with bench.sandbox(f"sandbox-runners-{label}", []) as sb:
        argv = ["-m", "pipeline", "run", "--input", str(corpus), "--output", str(output), "--model", MODEL,
                "--base-url", sb.base_url, *flags, *extra]
        bench.say(f"  running {label} ...")
        with Watch([os.getpid()] + ([pool_pid] if pool_pid else []), {sb.pid}) as watch:
            m = run_measured(argv, env=env, log_path=str(bench.logs / f"runners-{label}.log"))
            watch.sample()
        if m.returncode != 0:
            raise SystemExit(f"{label} exited with {m.returncode}:\n{m.log}")
    summary = json.loads((output / "summary.json").read_text())
    prism_cpu, prism_rss = watch.of(prism.PACKAGE.rsplit("/", 1)[1] + " --job_port")
    workers_cpu, workers_rss = watch.of("sdk_worker_main")
    launcher_cpu = m.cpu_s - prism_cpu   # os.wait4 counts the Prism it waited for
    bench.say(f"    {m.wall_s:.1f} s wall; launcher {launcher_cpu:.1f} s CPU {m.peak_rss_mb:.0f} MB; Prism "
              f"{prism_cpu:.1f} s {prism_rss:.0f} MB; pool workers {workers_cpu:.1f} s {workers_rss:.0f} MB; "
              f"load {m.load_before:.1f}->{m.load_after:.1f}")
    return [label, summary["documents"], summary["requests"], summary["metrics"].get("in_flight_peak", ""),
            m.wall_s, launcher_cpu, m.peak_rss_mb, prism_cpu or "", prism_rss or "", workers_cpu or "",
            workers_rss or "", f"{m.load_before:.1f}->{m.load_after:.1f}"]


def _total(row: list) -> float:
    """Peak RSS of the launcher, Prism and the pool's workers, added up (each at its own peak)."""
    return sum(v for v in (row[6], row[8], row[10]) if v != "")


def run(bench, docs: int, env: dict) -> None:
    """ENV: the runs' environment (the key among it), the pool's too."""
    work = bench.work / "runners"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    binary = str(prism.install())
    documents = make_documents(docs)
    corpus, tenth = work / "corpus.parquet", work / "tenth.parquet"
    pq.write_table(pa.Table.from_pylist(documents, schema=SCHEMA), corpus, row_group_size=2000, compression="zstd")
    pq.write_table(pa.Table.from_pylist(documents[:docs // 10], schema=SCHEMA), tenth, row_group_size=2000,
                   compression="zstd")
    text_mb = sum(len(d["text"].encode()) for d in documents) / 1e6
    port = free_port()
    pool_pid = pools.start(port, work / "pool", env)
    on_prism = ["--profile", "prism", "--prism_location", binary]
    on_pool = ["--profile", "prism-pool", "--prism_location", binary, "--environment_config", f"localhost:{port}"]
    try:
        rows = [_measure(bench, env, "local runner", corpus, [], None),
                _measure(bench, env, "Prism, LOOPBACK", corpus, on_prism, None, out=work / "kept"),
                _measure(bench, {**env, workerpool.STATE_VAR: str(work / "pool")}, "Prism, worker pool", corpus,
                         on_pool, pool_pid),
                _measure(bench, env, f"Prism, LOOPBACK, {docs // 10:,} documents", tenth, on_prism, None),
                _measure(bench, env, "Prism, LOOPBACK, next day --sync, nothing changed", corpus, on_prism, None,
                         out=work / "kept", extra=("--sync",))]
    finally:
        pools.stop_pid(pool_pid)
    local, loopback, external = rows[:3]
    bench.emit(table(
        ["run", "documents", "requests", "in flight, peak", "wall s", "launcher CPU s", "launcher peak RSS MB",
         "Prism CPU s", "Prism peak RSS MB", "pool workers CPU s", "pool workers peak RSS MB", "load"], rows,
        f"Runners: {docs:,} documents ({text_mb:.0f} MB of text), zero-latency sandboxes, default settings. "
        f"Prism / local runner, wall: LOOPBACK {loopback[4] / local[4]:.2f}x, worker pool {external[4] / local[4]:.2f}x; "
        f"peak RSS of the run's processes added up: LOOPBACK {_total(loopback) / _total(local):.2f}x, worker pool "
        f"{_total(external) / _total(local):.2f}x"))
    bench.emit("Prism holds a PCollection that crosses a stage boundary in its own memory until the consuming "
               "stage has read it. On Prism the job groups texts by digest (its workers are not the launcher's "
               "threads, so the local runner's in-process claims cannot dedupe): the grouping's input, one "
               "(text_sha256, (text, n_tokens, ChunkRef)) per chunk of the run, is what Prism's peak follows: "
               "compare the tenth of the corpus, and the next day's --sync with nothing changed, whose Read "
               "passes no text to the grouping. Flink and Dataflow spill that shuffle to disk. The SDK worker "
               "(LOOPBACK: the launcher) receives the grouped input over the Fn API's data plane, in messages of "
               "tens of MB, while Prism runs several bundles of a stage at once in it.")
    shutil.rmtree(work, ignore_errors=True)

"""`make bench`: the pipeline against a sequential script, on one corpus, in one run.

    python -m tests.bench.run_bench [--help]    (--only-scale, --only-library, ...: one section)

Sections, in order (docs/BENCH.md says what each measures and what bounds it):
0. Start-up: the first request from the process start on the demo corpus, 5 runs, beside
   importing the driver's package alone.
1. Throughput on a corpus of --docs documents (tests/bench/corpus.py) against a sandbox
   answering after 50 ms + 5 us per token: the baseline script (tests/bench/baseline.py), then
   `pipeline run` for each --in-flight x --workers ("default": the adaptive limit up to
   configs/pipeline.yaml's ceiling), then the floor: the same chunks pre-packed and sent with
   no client work (tests/bench/floor.py).
2. Zero latency: client CPU per 1M tokens against the irreducible work
   (tests/bench/irreducible.py) and Beam's cost per element (tests/bench/beam_overhead.py); run
   just before the scale section and the irreducible timed again after it, so the largest
   corpus is set against readings on either side of it.
3. Scale: the same job on growing corpora; Sync: the next day's `run --sync` (tests/bench/sync.py);
   Switch: a DIR moved to another model over capped runs on a changing corpus (tests/bench/switch.py).
4. Rate limit: fixed concurrency, ConcurrencyLimiter, TokenBucketLimiter (tests/bench/aimd.py).
5. Capacity (--capacities, queue and 429 mode): the job at its defaults with 1 and 2 worker
   processes against the floor and against the job with its limit fixed at the capacity.
6. --profile: the zero-latency pipeline and sandbox again under tests/bench/sampler.py.
7. Library (tests/bench/library.py): embedpipe.EmbedTexts against the CLI job, and MLTransform
   with ServiceTextEmbeddings against Beam's OpenAITextEmbeddings (--only-library: alone).
8. Runners (tests/bench/runners.py): the job on the local runner, on Prism with LOOPBACK workers
   and with a worker pool's (EXTERNAL), on --runners-docs documents: wall, CPU and peak RSS of
   the launcher, of Prism and of the pool's workers (--only-runners: alone; builds Prism when
   missing, as `make prism`).
9. Publish (tests/bench/publish.py): the view into PostgreSQL against a bare COPY and
   langchain-postgres; day 2, a model switch's swap, search (--only-publish: alone).
Each run is a child process: wall, its CPU and peak RSS (os.wait4), the sandbox's CPU over the
same span, and from the ledger the first request and the answers' span. Figures go to the
terminal and to the generated section of docs/BENCH.md. Nothing here asserts speed.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

from pipeline.commands import demo
from pipeline.corpora.python_docs import write_python_docs_corpus
from service.catalog import get_model, load_models
from service.sandbox.launcher import SandboxProcess
from service.sandbox.store import read_ledger
from tests.bench import aimd, beam_overhead, concurrency, floor, irreducible, library, publish, runners, switch, sync
from tests.bench.corpus import write_corpus
from tests.bench.measure import Measured, load_average, process_cpu_s, run_measured
from tests.bench.postgres import view_bytes
from tests.bench.report import table, write_section

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-bench-not-a-secret"
MODEL = "text-embedding-3-small"
LATENCY = ["--latency-ms", "50", "--latency-per-token-us", "5"]
RATE_LIMIT = ["--faults", str(REPO / "configs/sandbox/faults-ratelimit.yaml"), "--latency-ms", "200"]
RATE_LIMIT_RPS, RATE_LIMIT_BURST = 20.0, 5.0   # as in configs/sandbox/faults-ratelimit.yaml


def _env() -> dict:
    return dict(os.environ, EMBEDDINGS_API_KEY=KEY,
                PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))


def _ts(iso: str) -> float:
    return dt.datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class Bench:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.workdir).resolve()
        self.logs = self.work / "logs"
        self.model = get_model(load_models(), MODEL)
        self.sections: list[str] = []
        self.targets: list[str] = []
        self.cpu_per_m: dict[int, float] = {}   # scale: documents -> client CPU s per 1M tokens
        # the irreducible per 1M tokens, timed just before the scale section and again just after it,
        # on the zero-latency run's output: the machine's speed drifts by 20% in minutes
        self.irreducible_per_m: list[float] = []
        self._irreducible_input: tuple[Path, Path, int] | None = None   # corpus, its output, tokens

    def say(self, text: str) -> None:
        print(text, flush=True)

    def emit(self, text: str) -> None:
        self.say("\n" + text)
        self.sections.append(text)

    def sandbox(self, name: str, args) -> SandboxProcess:
        db = self.work / f"{name}.db"
        for suffix in ("", "-wal", "-shm", ".log"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        return SandboxProcess(db, key=KEY, balance=1e7, args=args)

    # -- runs ------------------------------------------------------------------------------

    def measured(self, label: str, argv: list[str], sb: SandboxProcess) -> Measured:
        self.say(f"  running {label} ...")
        started = time.time()
        m = run_measured(argv, env=_env(), sandbox_pid=sb.pid, log_path=str(self.logs / f"{label}.log"))
        if m.returncode != 0:
            raise SystemExit(f"{label} exited with {m.returncode}:\n{m.log}")
        charges = [r for r in read_ledger(sb.db) if started <= _ts(r["created_at"]) <= started + m.wall_s]
        times = sorted(_ts(r["created_at"]) for r in charges)
        m.first_request_s = times[0] - started if times else float("nan")
        m.answer_span_s = times[-1] - times[0] if times else float("nan")
        self.say(f"    {m.wall_s:.1f} s wall, {m.cpu_s:.1f} s CPU, sandbox {m.sandbox_cpu_s:.1f} s CPU, "
                 f"load {m.load_before:.1f}->{m.load_after:.1f}")
        return m

    def baseline(self, corpus: Path, sb: SandboxProcess) -> tuple[Measured, dict]:
        result = self.work / "baseline.json"
        m = self.measured("baseline", ["-m", "tests.bench.baseline", "--input", str(corpus),
                                       "--base-url", sb.base_url, "--model", MODEL,
                                       "--output", str(self.work / "baseline.parquet"),
                                       "--result", str(result)], sb)
        return m, json.loads(result.read_text())

    def pipeline(self, label: str, corpus: Path, sb: SandboxProcess, in_flight: int | None, workers: int,
                 keep: bool = False, prefix: tuple[str, ...] = (), extra: tuple[str, ...] = (),
                 output: Path | None = None) -> tuple[Measured, dict, Path]:
        """IN_FLIGHT None: the default ceiling (configs/pipeline.yaml). OUTPUT given: kept as it
        is (the next day's run)."""
        out = output or self.work / f"out-{label}"
        if output is None:
            shutil.rmtree(out, ignore_errors=True)
        argv = [*prefix, "-m", "pipeline", "run", "--input", str(corpus), "--output", str(out),
                "--model", MODEL, "--base-url", sb.base_url, *extra]
        if in_flight is not None:
            argv += ["--max-in-flight", str(in_flight)]
        if workers > 1:
            argv += ["--direct_num_workers", str(workers), "--direct_running_mode", "multi_processing"]
        m = self.measured(label, argv, sb)
        summary = json.loads((out / "summary.json").read_text())
        if not keep:
            shutil.rmtree(out, ignore_errors=True)
        return m, summary, out

    def lower_bound(self, tokens: int, chunks: int, request_tokens: int | None = None) -> int:
        return max(math.ceil(tokens / (request_tokens or self.model.max_tokens_per_request)),
                   math.ceil(chunks / self.model.max_inputs_per_request))

    @staticmethod
    def settled(summary: dict, out: Path) -> tuple[int, float, int]:
        """(the limit the run settled at: its processes' final limits added up, from the Embed
        step's counters; the mean in flight; the peak)."""
        mean, peak = concurrency.in_flight(out)
        return summary["metrics"].get("in_flight_limit", peak), mean, peak

    # -- sections --------------------------------------------------------------------------

    def latency_runs(self, corpus: Path) -> None:
        a = self.args
        runs, view = [], None
        with self.sandbox("sandbox-latency", LATENCY) as sb:
            base_m, base = self.baseline(corpus, sb)
            for w in a.workers:
                for f in a.in_flight:
                    label = f"pipeline-{'default' if f is None else f'f{f}'}-w{w}"
                    m, s, out = self.pipeline(label, corpus, sb, f, w, keep=True)
                    runs.append((f, w, m, s, *self.settled(s, out)))
                    if f is None and w == 1:
                        view = view_bytes(out)
                    shutil.rmtree(out, ignore_errors=True)
            # a default run is compared with the floor at the most it had in flight (its limit may
            # be above: it grows while half of it is in use, and reading can leave it unfilled)
            wanted = {f for f in a.in_flight if f is not None} | {r[6] for r in runs if r[0] is None}
            floors = {f: self.floor(corpus, sb, f, base_m.wall_s) for f in sorted(wanted)}
        rows = [self._row("baseline (sequential, 100/request)", base_m, base["chunks"], base["prompt_tokens"],
                          base["requests"], base_m.wall_s) + ["", "", ""]]
        for f, w, m, s, settled, mean, peak in runs:
            at = peak if f is None else f
            name = "default settings (ceiling 32)" if f is None else f"max-in-flight {f}"
            rows.append(self._row(f"pipeline {name}, workers {w}", m, s["chunks"], s["prompt_tokens"], s["requests"],
                                  base_m.wall_s) + [f"{settled}", f"{mean:.1f} / {peak}",
                                                           f"{m.wall_s / floors[at][1]:.2f} (at {at})"])
            if f is None and w == 1:
                self.targets.append(
                    f"default settings, {a.docs:,} documents at 50 ms + 5 us/token: {base_m.wall_s / m.wall_s:.2f}x the "
                    f"sequential loop ({m.wall_s:.1f} s against {base_m.wall_s:.1f} s; target >= 5x); "
                    f"limit at the end {settled}, at most {peak} in flight (mean {mean:.1f}); wall / floor at "
                    f"{at} = {m.wall_s / floors[at][1]:.2f} (floor {floors[at][1]:.1f} s; target <= 1.15)")
        rows += [row + ["", "", ""] for row, _ in floors.values()]
        self.emit(table(
            ["run", "wall s", "chunks/s", "tokens/s", "x baseline", "requests (lower bound)", "client CPU s",
             "sandbox CPU s", "CPU floor s", "1st request s", "answers span s", "peak RSS MB", "load",
             "limit settled", "in flight mean / peak", "wall / floor (at that concurrency)"],
            rows, f"Sandbox latency 50 ms + 5 us/token; {a.docs:,} documents, {base['chunks']:,} chunks "
                  f"(baseline's 8191-token slices), {base['prompt_tokens']:,} tokens"))
        self.emit("x baseline = documents per second over the baseline's (the same corpus; token counts "
                  "differ slightly because the chunks are cut differently). max-in-flight N is the ceiling "
                  "of the adaptive limit (it starts at 2); limit settled = the limit at the end (summary.json "
                  "metrics.in_flight_limit, summed over worker processes); in flight = requests in flight over the answers' "
                  "span, from requests-*.parquet. The floor rows are no client at all (tests/bench/floor.py): "
                  "the best any client could do on this machine at that concurrency; wall / floor compares "
                  "each pipeline run with the floor at its ceiling, a default run with the floor at the most "
                  "it had in flight. "
                  "CPU floor = (client CPU + sandbox CPU) / nproc: no run on this machine can be faster. "
                  "1st request = start to the first answer the sandbox billed (read, split, dedupe, pack); "
                  "answers span = first to last billed answer.")
        self.base_cpu_per_m = base_m.cpu_s / base["prompt_tokens"] * 1e6
        if view is not None:
            total, text = view
            self.emit(f"The default run's view, current/embeddings-*.parquet at {self.model.dimensions:,} dimensions: "
                      f"{total / 1e6:,.1f} MB with each chunk's text, {(total - text) / 1e6:,.1f} MB without it "
                      f"(--no-chunk-text): the text is {text / total:.1%} of it ({text / 1e6:,.1f} MB, zstd; the "
                      f"vectors are written uncompressed).")
            self.targets.append(f"the view's bytes at {self.model.dimensions:,} dimensions, {a.docs:,} documents: "
                                f"{total / 1e6:,.1f} MB with the text, {(total - text) / 1e6:,.1f} MB without "
                                f"({total / (total - text):.2f}x)")

    def capacity_runs(self, corpus: Path) -> None:
        """The job at its defaults against a service with a capacity, with 1 and 2 worker
        processes, against the floor at that capacity and a run without one."""
        a = self.args
        doc = yaml.safe_load((REPO / "configs" / "models.yaml").read_text())
        doc["models"][MODEL]["max_tokens_per_request"] = a.capacity_request_tokens
        models = self.work / "models-capacity.yaml"
        models.write_text(yaml.safe_dump(doc))
        extra = ("--models-config", str(models))
        with self.sandbox("sandbox-capacity-none", LATENCY) as sb:
            _, s, out = self.pipeline("capacity-none", corpus, sb, None, 1, keep=True, extra=extra)
            reference = concurrency.rows_digest(out)
            shutil.rmtree(out, ignore_errors=True)
        bodies = floor.packed_bodies(corpus, MODEL, self.model.max_inputs_per_request, a.capacity_request_tokens,
                                     fill=0.99)
        rows, worst = [], {}
        for cap in a.capacities:
            with self.sandbox(f"sandbox-capacity-{cap}-floor", LATENCY + ["--capacity", str(cap)]) as sb:
                self.say(f"  floor at capacity {cap} ...")
                floor_s = floor.send_all(sb.base_url, KEY, bodies, cap)
            fixed = {w: self.fixed_at(cap, w, corpus, extra) for w in a.workers if cap % w == 0}
            for mode in ("queue", "429"):
                for w in a.workers:
                    label = f"capacity-{cap}-{mode}-w{w}"
                    args = LATENCY + ["--capacity", str(cap), "--capacity-mode", mode]
                    with self.sandbox(f"sandbox-{label}", args) as sb:
                        m, s, out = self.pipeline(label, corpus, sb, None, w, keep=True, extra=extra)
                        refused = concurrency.refused(sb.base_url)
                        twice = concurrency.paid_twice(list(read_ledger(sb.db)))
                    same = concurrency.rows_digest(out) == reference
                    settled, mean, peak = self.settled(s, out)
                    shutil.rmtree(out, ignore_errors=True)
                    share = refused / s["requests"]
                    by_fixed = f"{m.wall_s / fixed[w]:.2f}" if w in fixed else ""
                    rows.append([cap, mode, w, m.wall_s, floor_s, m.cpu_floor_s,
                                 f"{m.wall_s / floor_s:.2f}", m.first_request_s,
                                 f"{m.answer_span_s / floor_s:.2f}", fixed.get(w, ""), by_fixed,
                                 f"{s['requests']} ({self.lower_bound(s['prompt_tokens'], s['chunks'], a.capacity_request_tokens)})",
                                 refused, f"{100 * share:.1f}%", settled, f"{mean:.1f} / {peak}", twice,
                                 "yes" if same else "NO", f"{m.load_before:.1f}-{m.load_after:.1f}"])
                    seen = worst.setdefault((mode, w), [0.0, 0.0, 0.0, 0, 0.0])
                    worst[(mode, w)] = [max(seen[0], m.wall_s / floor_s), max(seen[1], m.answer_span_s / floor_s),
                                        max(seen[2], share), max(seen[3], abs(settled - cap)),
                                        max(seen[4], m.wall_s / fixed[w] if w in fixed else 0.0)]
        self.emit(table(["capacity", "mode", "workers", "wall s", "floor s (capacity in flight)", "CPU floor s",
                         "wall / floor",
                         "1st answer s", "answers span / floor", "fixed at the capacity s", "wall / fixed",
                         "requests (lower bound)", "429s", "429s / requests", "limit settled", "in flight mean / peak",
                         "texts paid twice", "same rows as without a capacity", "load"], rows,
                        f"Sandbox with a capacity (50 ms + 5 us/token), the job at its defaults; requests capped at "
                        f"{a.capacity_request_tokens:,} tokens ({a.docs:,} documents)"))
        self.emit("Capacity N: at most N requests of the account worked on at once; queue = the others wait "
                  "(latency grows), 429 = refused at once with Retry-After 1 s. The floor sends the same "
                  "pre-packed requests N at a time; CPU floor = (client CPU + sandbox CPU) / nproc of that run: "
                  "no run on this machine can be faster, whatever its limit. limit settled = the limits at the "
                  "end, summed over the worker processes (summary.json metrics.in_flight_limit). 1st answer = the process start to the first "
                  "answer billed (start-up; with 2 workers also the start of the worker processes, before "
                  "which nothing is sent); answers span = the first to the last answer billed: the part "
                  "the in-flight limit decides. fixed at the capacity = the same job with its limit fixed "
                  "where an adaptive one should settle (each worker process starts at capacity / workers, its "
                  "ceiling too: only a latency signal could take it lower), against the queueing sandbox: what this client does on this machine if it knew "
                  "the capacity; wall / fixed is then the cost of finding it.")
        for (mode, w), (ratio, span, share, off, by_fixed) in sorted(worst.items()):
            self.targets.append(f"capacity {'/'.join(map(str, a.capacities))}, {mode} mode, {w} worker(s): worst "
                                f"wall / floor {ratio:.2f} (target <= 1.2; answers span / floor {span:.2f}; "
                                f"wall / the job fixed at the capacity {by_fixed:.2f}), "
                                f"worst 429 share {100 * share:.1f}% "
                                f"(target <= 2% in 429 mode), farthest settled limit from the capacity {off}")

    def fixed_at(self, cap: int, workers: int, corpus: Path, extra: tuple[str, ...]) -> float:
        """The wall of the job with its limit fixed at CAP (CAP / WORKERS per worker process:
        starting there, as the ceiling) against a queueing sandbox of that capacity."""
        settings = yaml.safe_load((REPO / "configs" / "pipeline.yaml").read_text())
        settings["embed"]["initial_in_flight"] = cap // workers
        config = self.work / f"run-config-fixed-{cap}-w{workers}.yaml"
        config.write_text(yaml.safe_dump(settings))
        label = f"capacity-{cap}-fixed-w{workers}"
        with self.sandbox(f"sandbox-{label}", LATENCY + ["--capacity", str(cap)]) as sb:
            m, _, _ = self.pipeline(label, corpus, sb, cap // workers, workers, extra=(*extra, "--run-config", str(config)))
        return m.wall_s

    def floor(self, corpus: Path, sb: SandboxProcess, in_flight: int, base_wall_s: float) -> tuple[list, float]:
        self.say(f"  floor: the sandbox alone, {in_flight} in flight ...")
        bodies = floor.packed_bodies(corpus, MODEL, self.model.max_inputs_per_request,
                                     self.model.max_tokens_per_request)
        load0, cpu0 = load_average(), process_cpu_s(sb.pid)
        wall = floor.send_all(sb.base_url, KEY, bodies, in_flight)
        m = Measured(0, wall, 0.0, float("nan"), process_cpu_s(sb.pid) - cpu0, load0, load_average(), "")
        charges = list(read_ledger(sb.db))[-len(bodies):]
        tokens = sum(r["prompt_tokens"] for r in charges)
        chunks = sum(len(r["input_sha256"]) for r in charges)
        row = self._row(f"floor: sandbox alone, pre-packed, {in_flight} in flight", m, chunks, tokens,
                        len(bodies), base_wall_s)
        row[6], row[9], row[10], row[11] = "~0", "", "", ""
        return row, wall

    def _row(self, label, m: Measured, chunks, tokens, requests, base_wall_s):
        return [label, m.wall_s, chunks / m.wall_s, tokens / m.wall_s, f"{base_wall_s / m.wall_s:.2f}",
                f"{requests} ({self.lower_bound(tokens, chunks)})", m.cpu_s, m.sandbox_cpu_s,
                m.cpu_floor_s, m.first_request_s, m.answer_span_s, m.peak_rss_mb,
                f"{m.load_before:.1f}-{m.load_after:.1f}"]

    def zero_latency(self, corpus: Path) -> None:
        tiny = self.work / "corpus-tiny.parquet"
        write_corpus(tiny, 10)
        with self.sandbox("sandbox-zero", []) as sb:
            m, s, out = self.pipeline("pipeline-zero-latency", corpus, sb, None, 1, keep=True)
            fixed, _, _ = self.pipeline("pipeline-10-documents", tiny, sb, None, 1)
        tokens = s["prompt_tokens"]
        self._irreducible_input = (corpus, out, tokens)
        parts = self.time_irreducible()
        per_m = lambda cpu: cpu / tokens * 1e6
        irr = sum(v for k, v in parts.items() if not k.startswith("_"))
        rows = [["pipeline (default settings, workers 1), whole process", m.cpu_s, per_m(m.cpu_s)],
                ["  of which fixed: the same job on 10 documents", fixed.cpu_s, ""],
                ["  pipeline minus that fixed cost", m.cpu_s - fixed.cpu_s, per_m(m.cpu_s - fixed.cpu_s)],
                ["baseline script (from the latency run)", "", self.base_cpu_per_m],
                *[[f"  irreducible: {k}", v, per_m(v)] for k, v in parts.items() if not k.startswith("_")],
                ["irreducible, total", irr, per_m(irr)],
                ["pipeline / irreducible (whole; minus fixed)",
                 f"{m.cpu_s / irr:.2f}x; {(m.cpu_s - fixed.cpu_s) / irr:.2f}x", ""],
                *[[f"  not counted: {k[1:]}", v, per_m(v)] for k, v in parts.items()
                  if k.startswith("_") and k != "_tokens"],
                ["sandbox (same machine, not client work)", m.sandbox_cpu_s, per_m(m.sandbox_cpu_s)]]
        self.emit(table(["zero latency: client CPU", "CPU s", "CPU s per 1M tokens"], rows,
                        f"Zero-latency sandbox: {tokens:,} tokens, {s['chunks']:,} chunks, "
                        f"wall {m.wall_s:.1f} s, load {m.load_before:.1f}-{m.load_after:.1f}"))
        self.say("  timing Beam's per-element cost ...")
        self.emit(table(["Beam on this machine (FnApiRunner)", "CPU us per element"],
                        [[k, v] for k, v in beam_overhead.measure().items()]))

    def time_irreducible(self) -> dict[str, float]:
        """The irreducible work on the zero-latency run's corpus and output (kept until the scale
        section is done: it is timed on either side of it)."""
        corpus, out, tokens = self._irreducible_input
        self.say("  timing the irreducible work ...")
        parts = irreducible.measure(corpus, sorted(out.glob("current/embeddings-*.parquet")))
        self.irreducible_per_m.append(sum(v for k, v in parts.items() if not k.startswith("_")) / tokens * 1e6)
        return parts

    def scale(self) -> None:
        """The same job at growing corpus sizes: memory should stay flat, and the first request
        should leave within seconds whatever the size (streaming)."""
        rows, ratio = [], None
        with self.sandbox("sandbox-scale", []) as sb:
            for docs in self.args.scale:
                corpus = self.work / f"corpus-{docs}.parquet"
                write_corpus(corpus, docs)
                m, s, _ = self.pipeline(f"pipeline-scale-{docs}", corpus, sb, None, 1)
                timing = s.get("timing") or {}
                first = timing.get("seconds_to_first_request")
                from_process = timing.get("seconds_from_process_start_to_first_request")
                self.cpu_per_m[docs] = m.cpu_s / s["prompt_tokens"] * 1e6
                rows.append([f"{docs:,}", m.wall_s, "" if first is None else first,
                             "" if from_process is None else from_process, m.first_request_s, m.peak_rss_mb,
                             m.cpu_s / s["prompt_tokens"] * 1e6, s["prompt_tokens"], s["requests"],
                             f"{s['requests']} ({self.lower_bound(s['prompt_tokens'], s['chunks'])})"])
                ratio = ratio or m.peak_rss_mb
                rows[-1].append(f"{m.peak_rss_mb / ratio:.2f}")
                corpus.unlink()
        self.emit(table(["documents", "wall s", "1st request left s, from the job's start (summary.json)",
                         "from the process start", "1st answer billed s (ledger)", "peak RSS MB",
                         "client CPU s per 1M tokens", "tokens", "requests", "requests (lower bound)",
                         "RSS / smallest"], rows,
                        "Scale: zero-latency sandbox, default settings, one worker (FnApiRunner, streaming)"))

    def start_up(self, runs: int = 5) -> None:
        """The first request from the process start on the demo corpus (`make run`'s: 79 topics
        cut into passages of 300 tokens, one request), against what importing the driver's
        package alone takes."""
        corpus = self.work / "corpus-demo.parquet"
        write_python_docs_corpus(str(corpus))
        imports = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run([sys.executable, "-c", "import pipeline"], env=_env(), check=True, capture_output=True)
            imports.append(time.perf_counter() - started)
        firsts = []
        with self.sandbox("sandbox-start-up", []) as sb:
            for i in range(runs):
                _, s, _ = self.pipeline(f"pipeline-demo-{i}", corpus, sb, None, 1,
                                        extra=("--chunk-tokens", str(demo.CHUNK_TOKENS)))
                firsts.append(s["timing"]["seconds_from_process_start_to_first_request"])
        rows = [["first request, from the process start", min(firsts), statistics.median(firsts), max(firsts)],
                ["`python -c 'import pipeline'` (Beam with it)", min(imports), statistics.median(imports),
                 max(imports)]]
        self.emit(table(["demo corpus, zero-latency sandbox", "min s", "median s", "max s"], rows,
                        f"Start-up: {runs} runs of the job on the demo corpus (make run's: 79 topics cut into "
                        f"{demo.CHUNK_TOKENS}-token passages, one request)"))
        self.targets.append(f"first request from the process start on the demo corpus: median "
                            f"{statistics.median(firsts):.2f} s over {runs} runs (min {min(firsts):.2f}; target <= 1 s); "
                            f"importing the package alone {statistics.median(imports):.2f} s")

    def rate_limited(self, corpus: Path) -> None:
        texts = [t[:400] for t in pq.read_table(corpus, columns=["text"]).column("text").to_pylist()[:4000]]
        per, n = 20, self.args.aimd_requests
        batches = [[texts[(i * per + j) % len(texts)] for j in range(per)] for i in range(n)]
        rows = []
        for mode in aimd.MODES:
            with self.sandbox(f"sandbox-ratelimit-{mode}", RATE_LIMIT) as sb:
                self.say(f"  rate-limited: {mode} ...")
                r = aimd.run_mode(mode, sb.base_url, KEY, MODEL, batches, self.args.aimd_threads,
                                  RATE_LIMIT_RPS * 0.9, RATE_LIMIT_BURST)
            rows.append([mode, r.requests, r.failed, r.rate_limited, r.wall_s, r.rps,
                         "" if r.final_limit is None else f"{r.final_limit:.1f}",
                         "" if r.decreases is None else r.decreases])
        self.emit(table(["mode", "requests ok", "failed", "429s", "wall s", "requests/s", "final limit",
                         "decreases"], rows,
                        f"Embeddings rate limit {RATE_LIMIT_RPS:.0f} rps (burst {RATE_LIMIT_BURST:.0f}, Retry-After "
                        f"1 s), 200 ms latency; {n} requests of {per} short texts from "
                        f"{self.args.aimd_threads} threads (bucket set to 90% of the quota)"))

    def profile(self, corpus: Path) -> None:
        out = {name: self.work / f"profile-{name}.json" for name in ("pipeline", "sandbox")}
        prefix = ("-m", "tests.bench.sampler")

        class Profiled(SandboxProcess):   # the launcher's command, run under the sampler
            def _argv(self, port):
                argv = super()._argv(port)
                return [argv[0], *prefix, str(out["sandbox"]), *argv[1:]]

        db = self.work / "sandbox-profile.db"
        db.unlink(missing_ok=True)
        with Profiled(db, key=KEY, balance=1e7) as sb:
            self.pipeline("pipeline-profiled", corpus, sb, 8, 1, prefix=(*prefix, str(out["pipeline"])))
        for name, path in out.items():
            data = json.loads(path.read_text())
            total = data["process_cpu_s"]
            rows = [[k, v, f"{100 * v / total:.0f}%"] for k, v in data["categories"].items() if v >= 0.005 * total]
            self.emit(table([f"{name}: where the CPU goes", "CPU s", "share"], rows,
                            f"Profile ({name}, zero latency, sampled): {total:.1f} s CPU"))
            self.emit(table([f"{name}: inclusive CPU of selected functions", "CPU s"],
                            [[k, v] for k, v in data["inclusive"].items()][:25]))

    def run(self) -> None:
        a = self.args
        self.work.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(exist_ok=True)
        started = time.time()
        cpu_model = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if
                          line.startswith("model name")), platform.processor())
        self.emit(f"Run {dt.datetime.now().astimezone():%Y-%m-%d %H:%M %Z} on {platform.node()}: "
                  f"nproc {os.cpu_count()}, {cpu_model}, Python {platform.python_version()}, "
                  f"load average {load_average():.1f} at start. Command: "
                  f"`python -m tests.bench.run_bench {' '.join(sys.argv[1:])}`".rstrip())
        if a.only_switch:
            switch.run(self, a.switch_docs)
            return self._finish(started)
        if a.only_runners:
            runners.run(self, a.runners_docs, _env())
            return self._finish(started)
        if a.only_publish:
            publish.run(self, a.publish_docs)
            return self._finish(started)
        corpus = self.work / "corpus.parquet"
        docs = write_corpus(corpus, a.docs)
        self.say(f"corpus: {corpus} ({len(docs):,} documents, {corpus.stat().st_size / 1e6:.1f} MB)")
        if a.only_library:
            library.run(self, corpus)
            return self._finish(started)
        self.start_up()
        whole = not (a.only_scale or a.only_capacity)
        if whole:
            self.latency_runs(corpus)
            self.zero_latency(corpus)   # just before the scale section: the irreducible is timed on either side
        if a.scale:
            self.scale()
            if whole:
                self.time_irreducible()
        if whole:
            shutil.rmtree(self._irreducible_input[1], ignore_errors=True)
        if a.sync_docs:
            sync.run(self, a.sync_docs)
        if whole and a.switch_docs:
            switch.run(self, a.switch_docs)
        if a.only_scale:
            return self._finish(started)
        if whole and a.aimd:
            self.rate_limited(corpus)
        if a.capacity:
            self.capacity_runs(corpus)
        if a.profile:
            self.profile(corpus)
        if whole:
            library.run(self, corpus)
        if whole and a.runners_docs:
            runners.run(self, a.runners_docs, _env())
        if whole and any(a.publish_docs):   # the publish section
            publish.run(self, a.publish_docs)
        self._finish(started)

    def _finish(self, started: float) -> None:
        largest = max(self.cpu_per_m, default=None)
        if largest and self.irreducible_per_m:
            irr = self.irreducible_per_m
            mean = sum(irr) / len(irr)
            self.targets.append(f"client CPU per 1M tokens at {largest:,} documents: {self.cpu_per_m[largest]:.3f} s "
                                f"= {self.cpu_per_m[largest] / mean:.2f}x the irreducible timed around the scale "
                                f"section ({' then '.join(f'{v:.3f}' for v in irr)} s, mean {mean:.3f}; "
                                f"{min(self.cpu_per_m[largest] / v for v in irr):.2f}-"
                                f"{max(self.cpu_per_m[largest] / v for v in irr):.2f}x; target <= 1.5x)")
        if self.targets:
            self.emit("Against the targets, from this run:\n\n" + "\n".join(f"- {t}" for t in self.targets))
        self.emit(f"Whole bench: {time.time() - started:.0f} s; load average {load_average():.1f} at the end.")
        if self.args.write:
            write_section(REPO / "docs" / "BENCH.md", "\n\n".join(self.sections))
            self.say(f"\nwritten: {REPO / 'docs' / 'BENCH.md'}")


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _ceilings(text: str) -> list[int | None]:
    return [None if x.strip() == "default" else int(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.bench.run_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=20000, help="documents in the corpus")
    ap.add_argument("--in-flight", type=_ceilings, default=[None, 4, 8, 16],
                    help="--max-in-flight values, 'default' for none, e.g. default,4,8,16")
    ap.add_argument("--workers", type=_ints, default=[1, 2], help="--direct_num_workers values, e.g. 1,2")
    ap.add_argument("--workdir", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "embedpipe-bench"))
    ap.add_argument("--scale", type=_ints, default=[2000, 20000, 200000],
                    help="corpus sizes of the scale section (add 1000000 for the million-document run)")
    ap.add_argument("--only-scale", action="store_true", help="run the scale (and sync) sections alone")
    ap.add_argument("--sync-docs", type=int, default=200000,
                    help="documents of the next-day --sync section (0: skip it)")
    ap.add_argument("--switch-docs", type=int, default=200000,
                    help="documents of the model-switch section (0: skip it)")
    ap.add_argument("--only-switch", action="store_true", help="run the model-switch section alone")
    ap.add_argument("--capacities", type=_ints, default=[4, 8],
                    help="the sandbox's capacities in the capacity section (1 with 2 workers: more processes than places)")
    ap.add_argument("--only-capacity", action="store_true", help="run the capacity section (and --scale) alone")
    ap.add_argument("--no-capacity", dest="capacity", action="store_false", help="skip the capacity section")
    ap.add_argument("--capacity-request-tokens", type=int, default=30_000,
                    help="tokens per request in the capacity section (many requests: a 429 share means something)")
    ap.add_argument("--aimd-requests", type=int, default=200)
    ap.add_argument("--aimd-threads", type=int, default=16)
    ap.add_argument("--no-aimd", dest="aimd", action="store_false", help="skip the rate-limit section")
    ap.add_argument("--profile", action="store_true", help="also profile the zero-latency run (slower)")
    ap.add_argument("--no-write", dest="write", action="store_false", help="do not update docs/BENCH.md")
    ap.add_argument("--only-library", action="store_true", help="run the library section alone")
    ap.add_argument("--library-texts", type=int, default=5000, help="texts of the library's MLTransform runs")
    ap.add_argument("--library-repeats", type=int, default=2, help="CLI / EmbedTexts pairs of the library section")
    ap.add_argument("--runners-docs", type=int, default=20000,
                    help="documents of the runners section (0: skip it)")
    ap.add_argument("--only-runners", action="store_true", help="run the runners section alone")
    ap.add_argument("--publish-docs", type=_ints, default=[20000, 200000],
                    help="documents of the publish section's two views, at the model's dimensions then at 256 "
                         "(0: skip it)")
    ap.add_argument("--only-publish", action="store_true", help="run the publish section alone")
    Bench(ap.parse_args(argv)).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())

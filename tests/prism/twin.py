"""One CLI command on the local runner and on Prism, each against its own DIR and its own sandbox
started alike, and the two outcomes compared: exit code, stdout, the launcher's own log lines,
DIR's view bit for bit (every kind of row, vectors as bytes), summary.json. After every command
the key is searched for in Prism's log, the worker pool's log, both launchers' output and DIR.

    pair = both()                      # the fixture (conftest.py): one side per runner
    pair.cli("run", "--input", corpus, "--output", "{out}", "--model", MODEL, "--base-url", "{base_url}")
    pair.cli("plan", "--input", corpus, "--model", MODEL, "--base-url", "{base_url}", "--json")

`{out}` (the side's DIR), `{base_url}` (its sandbox), `{tmp}` (a directory of its own) and the
names in the side's `values` (its database's URL, say: `{db}`) are each side's. `extra=fn`
compares fn(side) too, normalised as the rest (what a command leaves outside DIR: a table it
published, as a list of rows, say); `compare=False` returns both outcomes unchecked. What
differs between any two runs is normalised: run ids (by their order in DIR's history),
request ids (by the texts each request carried, from the sandbox's ledger), times, latencies,
DIR's path and the side's values; a JSON output is compared as its values. Runners cut bundles differently, and requests are packed per bundle:
when the two sides packed other requests, what follows from the packing (a row's request and
cost, the requests' rows) is compared by its invariants instead (totals within the service's
rounding of 1e-6 RUB a request, each text's share within 1.5e-6 RUB of its tokens x price).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from pipeline.outdir.layout import READER_KINDS
from service.sandbox.store import read_ledger
from tests.e2e.test_secrets import hits

RUN_ID = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{6}")
RUNNER_COMMANDS = ("run", "plan", "publish")      # the commands that take Beam's options
TIMEOUT_S = 300
_DROPPED = {"timing", "embedded_at", "started_at", "latency_ms", "files", "runner"}   # runner: each side's own
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+) ([\w.]+): (.*)$")
_OWN = ("embedpipe", "service", "transforms", "pipeline")
_PACKING = ("request_id", "cost_rub", "run_id")   # and which run paid: a budget cut follows the order
# Beam's counters that follow from timing (the in-flight limiter's), or from how the step
# dedupes: the local runner streams, and copies a text's later rows after the job (late, not
# counted as embedded by the job); other runners group every row of a text before sending it
_TIMING_OR_MODE = {"in_flight_limit", "in_flight_peak", "latency_decreases", "limit_decreases", "embedded_chunks"}
_STATE = ("exit_code", "current", "pending", "failed_reasons", "pending_reasons")


@dataclasses.dataclass
class Outcome:
    side: str
    code: int
    stdout: str
    log: list[str]           # the launcher's own log lines (embedpipe, service, ...), normalised
    view: dict[str, list]    # kind -> rows, normalised and sorted
    summary: dict | None
    packing: list            # the texts of each request billed so far (this command's and earlier ones)
    extra: Any = None
    raw_stderr: str = ""

    def same_packing(self, other: Outcome) -> bool:
        return self.packing == other.packing


class Side:
    """One runner's DIR, sandbox and command line."""

    def __init__(self, name: str, root: Path, sandbox, flags: Sequence[str], env: dict[str, str],
                 scanned: Callable[[], dict[str, bytes]], key: str):
        self.name, self.root, self.sandbox, self.flags, self.env = name, root, sandbox, list(flags), env
        self._scanned, self.key = scanned, key
        self.out, self.tmp = root / "out", root / "tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.values: dict[str, str] = {}

    def fill(self, arg: str) -> str:
        return arg.format(out=self.out, base_url=self.sandbox.base_url, tmp=self.tmp, **self.values) \
            if "{" in arg else arg

    def argv(self, command: str, args: Sequence[str]) -> list[str]:
        own = self.flags if command in RUNNER_COMMANDS else []
        return [sys.executable, "-m", "pipeline", command, *own, *(self.fill(str(a)) for a in args)]

    def start(self, command: str, *args: str, log: Path | None = None) -> subprocess.Popen:
        """The command as a process of its own group (a test may kill it), output to LOG."""
        fh = open(log or self.tmp / "started.log", "wb")
        return subprocess.Popen(self.argv(command, args), stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                start_new_session=True)

    def cli(self, command: str, *args: str, extra: Callable[[Side], Any] | None = None,
            env: dict[str, str] | None = None) -> Outcome:
        done = subprocess.run(self.argv(command, args), capture_output=True, text=True, timeout=TIMEOUT_S,
                              env={**self.env, **(env or {})})
        self.assert_no_key(done.stdout, done.stderr)
        return self.outcome(done.returncode, done.stdout, done.stderr, extra)

    def ledger(self) -> list[dict]:
        return list(read_ledger(self.sandbox.db))

    def assert_no_key(self, *texts: str) -> None:
        blobs = {f"{self.name} output {i}": t.encode() for i, t in enumerate(texts)}
        blobs.update(self._scanned())
        if self.out.exists():
            blobs.update({str(p): p.read_bytes() for p in self.out.rglob("*") if p.is_file()})
        assert not hits(self.key, blobs), f"the key is in {hits(self.key, blobs)}"

    def outcome(self, code: int, stdout: str, stderr: str, extra=None) -> Outcome:
        """What the command left, with every request the side's sandbox billed so far."""
        charges = self.ledger()
        names = _Names(self.out, charges, str(self.root), self.values)
        summary = json.loads((self.out / "summary.json").read_text()) if (self.out / "summary.json").exists() else None
        try:
            shown = names.value(json.loads(stdout))
        except json.JSONDecodeError:
            shown = names.text(stdout)
        return Outcome(self.name, code, shown, _own_lines(stderr, names), self.view(names),
                       names.value(summary), sorted(sorted(c["input_sha256"]) for c in charges),
                       names.value(extra(self)) if extra else None, stderr)

    def view(self, names: _Names) -> dict[str, list]:
        if not (self.out / "_current.json").exists():
            return {}
        files = json.loads((self.out / "_current.json").read_text())["files"]
        return {kind: sorted((_row(r, names) for f, _ in files[kind] for r in pq.read_table(self.out / f).to_pylist()),
                             key=repr) for kind in READER_KINDS if kind in files}


class _Names:
    """What two runs name differently, named by what it stands for."""

    def __init__(self, out: Path, ledger: list[dict], root: str, values: dict[str, str] | None = None):
        runs = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")] if out.exists() else []
        runs.sort(key=lambda r: r["started_at"])
        self.runs = {r["run_id"]: f"RUN{i}" for i, r in enumerate(runs, 1)}
        self.requests = {c["request_id"]: "REQ(" + ",".join(sorted(h[:10] for h in c["input_sha256"])) + ")"
                         for c in ledger}
        self.root, self.values = root, values or {}

    def text(self, s: str) -> str:
        for name, value in self.values.items():
            s = s.replace(value, f"<{name}>")
        s = s.replace(self.root, "<SIDE>")
        s = RUN_ID.sub(lambda m: self.runs.get(m.group(), "RUN?"), s)
        return re.sub(r"\b[0-9a-f]{32}\b", lambda m: self.requests.get(m.group(), m.group()), s)

    def value(self, v, key: str = ""):
        if key == "metrics":   # a counter never incremented: Prism reports it as 0, FnApiRunner not at all
            return {k: x for k, x in v.items() if x and k not in _TIMING_OR_MODE}
        if isinstance(v, dict):
            return {self.text(k): self.value(x, k) for k, x in v.items()
                    if k not in _DROPPED and not k.endswith(("_at", "_s")) and not k.startswith("seconds")}
        if isinstance(v, list):
            return [self.value(x) for x in v]
        return self.text(v) if isinstance(v, str) else v


def _row(row: dict, names: _Names) -> dict:
    out = {}
    for k, v in row.items():
        if k in _DROPPED or k == "balance_after":   # a request's balance depends on the order answers came
            continue
        if k == "embedding" and v is not None:
            v = np.asarray(v, dtype=np.float32).tobytes()
        out[k] = names.value(v) if isinstance(v, (str, dict, list)) else v
    return out


def _own_lines(stderr: str, names: _Names) -> list[str]:
    """The launcher's own log lines without their time: what the user reads (but the progress
    line, which a run shows when it lasts long enough)."""
    lines = []
    for line in stderr.splitlines():
        if (m := _LOG_LINE.match(line)) and m.group(2).split(".")[0] in _OWN and m.group(2) != "embedpipe.progress":
            lines.append(f"{m.group(1)} {m.group(2)}: {names.text(m.group(3))}")
    return lines


def difference(a, b, path: str = "") -> str | None:
    """Where A and B first differ, with both values (short): what an assertion should say."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a or k not in b:
                return f"{path}/{k}: only in {'the first' if k in a else 'the second'}"
            if (d := difference(a[k], b[k], f"{path}/{k}")) is not None:
                return d
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{path}: {len(a)} items against {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            if (d := difference(x, y, f"{path}[{i}]")) is not None:
                return d
        return None
    return None if a == b else f"{path}: {str(a)[:300]!r} against {str(b)[:300]!r}"


def assert_same(local: Outcome, other: Outcome, price_per_token: float | None = None) -> None:
    """OTHER (Prism) as LOCAL: exactly where both packed the same requests, else all that does
    not follow from the packing, and the money's invariants."""
    where = f"{other.side} against {local.side}"
    assert other.code == local.code, f"{where}: exit {other.code} != {local.code}\n{other.raw_stderr[-3000:]}"
    strip = lambda rows: [{k: v for k, v in r.items() if k not in _PACKING} for r in rows]
    if other.same_packing(local) or not isinstance(local.extra, list):
        assert other.extra == local.extra, f"{where}: {difference(local.extra, other.extra, 'extra')}"
    else:   # rows: what follows from the packing aside, as the view's
        assert strip(other.extra) == strip(local.extra), f"{where}: {difference(local.extra, other.extra, 'extra')}"
    if other.same_packing(local):
        for part in ("log", "stdout", "view", "summary"):
            a, b = getattr(local, part), getattr(other, part)
            assert a == b, f"{where}: {difference(a, b, part)}" + (f"\n{a}\n{b}" if part == "log" else "")
        return
    for kind in set(local.view) | set(other.view):
        if kind != "requests":
            a, b = strip(local.view.get(kind, [])), strip(other.view.get(kind, []))
            assert a == b, f"{where}: {difference(a, b, kind)}"
    sent = lambda o: sorted(h for request in o.packing for h in request)
    assert sent(other) == sent(local), f"{where}: other texts were sent"
    if local.summary is not None:   # what the view holds after the command, and how it ended
        a, b = ({k: o.summary.get(k) for k in _STATE} for o in (local, other))
        assert a == b, f"{where}: {difference(a, b, 'summary')}"
    paid = lambda o: sum(r["cost_rub"] for r in o.view.get("embeddings", []))
    assert abs(paid(other) - paid(local)) <= (len(local.packing) + len(other.packing)) * 1e-6 + 1e-9, where
    if price_per_token is not None:   # each text's share (split among its rows): its tokens' price
        for o in (local, other):
            shares, tokens = collections.Counter(), {}
            for row in o.view.get("embeddings", []):
                shares[row["text_sha256"]] += row["cost_rub"]
                tokens[row["text_sha256"]] = row["n_tokens"]
            for sha, share in shares.items():
                assert abs(share - tokens[sha] * price_per_token) <= 1.5e-6 + 1e-12, (o.side, sha, share)


class Pair:
    """The local runner's side and Prism's: each command runs on both, and is compared."""

    def __init__(self, local: Side, prism: Side, price_per_token: float | None = None):
        self.local, self.prism, self.price = local, prism, price_per_token
        self.sides = (local, prism)

    def cli(self, command: str, *args: str, extra: Callable[[Side], Any] | None = None,
            compare: bool = True) -> tuple[Outcome, Outcome]:
        """COMMAND on both sides, compared unless COMPARE is false (the caller then checks what
        may differ: which rows a budget cut left pending depends on the order texts came in)."""
        started = time.monotonic()
        local = self.local.cli(command, *args, extra=extra)
        middle = time.monotonic()
        other = self.prism.cli(command, *args, extra=extra)
        print(f"\n{command}: exit {local.code} / {other.code}; local {middle - started:.1f} s, "
              f"{self.prism.name} {time.monotonic() - middle:.1f} s")
        if compare:
            assert_same(local, other, self.price)
        return local, other


def leftover_processes(binary: str, before: set[int]) -> list[int]:
    """Processes running BINARY that were not there before."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit() and int(p.name) not in before:
            try:
                if (p / "cmdline").read_bytes().split(b"\0")[0].decode(errors="replace") == binary:
                    found.append(int(p.name))
            except OSError:
                continue
    return found


def processes_of(binary: str) -> set[int]:
    return set(leftover_processes(binary, set()))


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s")
        time.sleep(0.05)


def env_for(key: str, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "EMBEDDINGS_API_KEY"}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, "EMBEDDINGS_API_KEY": key, **more}

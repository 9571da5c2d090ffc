"""Measuring a child process: wall time, its CPU (os.wait4: the child's and its waited-for
descendants'), its peak RSS (the kernel's VmHWM of the child, read while it runs), and the
sandbox's CPU over the same span.

Not ru_maxrss: Linux carries the high-water mark of the address space a child was forked
with across exec, so a child of a large parent (the bench, after building a 200k-document
corpus) reported the parent's size (1.87 GB for a job that peaked at 0.6 GB)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from collections.abc import Sequence

_TICK = os.sysconf("SC_CLK_TCK")


def process_cpu_s(pid: int) -> float:
    """user+system CPU of a live process, all its threads (from /proc)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def peak_rss_mb(pid: int) -> float | None:
    """The child's own high-water mark (VmHWM), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def load_average() -> float:
    return os.getloadavg()[0]


@dataclasses.dataclass
class Measured:
    returncode: int
    wall_s: float
    cpu_s: float           # the child and its descendants, user + system
    peak_rss_mb: float     # the child's VmHWM (its descendants not included)
    sandbox_cpu_s: float
    load_before: float
    load_after: float
    log: str               # stderr tail, for a failed run
    first_request_s: float = float("nan")   # start to the first billed answer (from the ledger)
    answer_span_s: float = float("nan")     # first to last billed answer

    @property
    def cpu_floor_s(self) -> float:
        """(client CPU + sandbox CPU) / nproc: no run on this machine can be faster."""
        return (self.cpu_s + self.sandbox_cpu_s) / (os.cpu_count() or 1)


def run_measured(argv: Sequence[str], *, env: dict | None = None, sandbox_pid: int | None = None,
                 log_path: str | None = None, timeout_s: float = 1800) -> Measured:
    """Run ARGV (python is sys.executable) to completion; stdout+stderr go to LOG_PATH."""
    load0 = load_average()
    sb0 = process_cpu_s(sandbox_pid) if sandbox_pid else 0.0
    log_path = log_path or os.devnull
    with open(log_path, "wb") as log:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, *argv], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, env=env)
        deadline, peak = started + timeout_s, 0.0
        while True:   # wait4 with a deadline: a hung run must not hang the bench
            peak = max(peak, peak_rss_mb(proc.pid) or 0.0)  # monotonic: the last reading is the peak
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    sb = process_cpu_s(sandbox_pid) - sb0 if sandbox_pid else 0.0
    tail = ""
    if proc.returncode != 0 and log_path != os.devnull:
        with open(log_path, "rb") as fh:
            tail = fh.read()[-3000:].decode("utf-8", "replace")
    return Measured(proc.returncode, wall, usage.ru_utime + usage.ru_stime, peak,
                    sb, load0, load_average(), tail)

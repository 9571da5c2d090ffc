"""A CPU-weighted sampling profiler for every Python thread (py-spy is not installed).

Every 10 ms it reads each thread's stack (tests/frames.py's current_frames) and the CPU that thread used
since the last sample (/proc/self/task/TID/schedstat), and charges that CPU to the stack.
So waits cost nothing and threads in C code (tiktoken, zlib, numpy release the GIL) are
charged correctly. CPU of threads Python does not know (Arrow's pools) is the process total
minus the Python threads' sum.

    python -m tests.bench.sampler OUT.json -m package.module [args...]

runs a module as __main__ under the sampler and writes a summary to OUT.json on exit
(including SIGTERM, which it turns into SystemExit once the module's own handler has run).
"""
from __future__ import annotations

import collections
import json
import os
import resource
import runpy
import sys
import threading
import time

from tests.frames import current_frames

# (category, substrings of a frame's "file:function"), the first frame from the leaf up that
# matches names the category; order matters where paths nest.
CATEGORIES = (
    ("tokenise (tiktoken)", ("tiktoken/",)),
    ("split/pack logic", ("transforms/read/split.py", "transforms/pack.py", "transforms/dedupe/distinct.py")),
    ("sha256", ("hashlib", ":_sha")),
    ("json encode", ("json/encoder.py",)),
    ("json decode", ("json/decoder.py", "json/__init__.py:loads")),
    ("base64/vector decode", ("client.py:decode_vectors", "base64.py")),
    ("sandbox embedder (numpy)", ("sandbox/embedder.py",)),
    ("sandbox body build", ("sandbox/server.py:embeddings_body",)),
    ("sqlite ledger", ("sandbox/store.py",)),
    ("parquet/arrow write", ("pyarrow/parquet", "parquetio.py", "transforms/write/transform.py", "transforms/money/lineage.py",
                             "transforms/money/journal.py")),
    ("parquet read", ("pyarrow/dataset", "transforms/read/transform.py")),
    ("http client (requests/urllib3)", ("requests/", "urllib3/", "http/client.py")),
    ("http server", ("http/server.py", "socketserver.py")),
    ("socket I/O", ("socket.py", "ssl.py", "selectors.py")),
    ("beam coders/pickling", ("apache_beam/coders", "pickle", "dill", "cloudpickle")),
    ("beam runner & DoFn plumbing", ("apache_beam/",)),
    ("embed DoFn/runner", ("transforms/embed",)),
    ("other project code", ("/service/", "/transforms/", "/pipeline/")),
)

# Frames whose inclusive CPU (the frame and everything it called) is worth reporting.
_REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
INCLUSIVE = (*(os.path.join(_REPO, d) + os.sep for d in ("service", "transforms", "pipeline")),
             "parquet/core.py:write_table", "json/__init__.py:loads",
             "base64.py:b64decode", "tiktoken/core.py:encode_ordinary", "parquetio.py:", "bundle_processor.py:process_bundle")


def categorise(stack: tuple[str, ...]) -> str:
    for frame in stack:   # leaf first
        for name, needles in CATEGORIES:
            if any(n in frame for n in needles):
                return name
    return "other (stdlib, interpreter)"


class CpuSampler:
    def __init__(self, interval_s: float = 0.01, depth: int = 40):
        self.interval_s, self.depth = interval_s, depth
        self.stacks: collections.Counter = collections.Counter()
        self._last: dict[int, float] = {}   # native thread id -> CPU seconds at the last sample
        self._fds: dict[int, int] = {}
        self.own_cpu_s = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._rusage0 = None

    def start(self) -> CpuSampler:
        self._rusage0 = resource.getrusage(resource.RUSAGE_SELF)
        for t in threading.enumerate():   # threads seen later count from their start (0)
            self._last[t.native_id] = self._thread_cpu(t.native_id) or 0.0
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        self.process_cpu_s = (r1.ru_utime - self._rusage0.ru_utime) + (r1.ru_stime - self._rusage0.ru_stime)
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _thread_cpu(self, tid: int) -> float | None:
        """CPU seconds of thread TID, from /proc's schedstat (ns). Thread ids, unlike pthread
        handles, are safe to use after the thread ended: the read just fails."""
        fd = self._fds.get(tid)
        try:
            if fd is None:
                fd = self._fds[tid] = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY)
            return int(os.pread(fd, 64, 0).split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            if fd is not None:
                os.close(self._fds.pop(tid))
            return None

    def _loop(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval_s):
            native = {t.ident: t.native_id for t in threading.enumerate()}
            for ident, frame in current_frames().items():
                tid = native.get(ident)
                if ident == me or tid is None:
                    continue
                cpu = self._thread_cpu(tid)
                if cpu is None:
                    continue
                used = cpu - self._last.get(tid, 0.0)
                self._last[tid] = cpu
                if used <= 0:
                    continue
                stack, f = [], frame
                while f is not None and len(stack) < self.depth:
                    code = f.f_code
                    stack.append(f"{code.co_filename}:{code.co_name}")
                    f = f.f_back
                self.stacks[tuple(stack)] += used
        self.own_cpu_s = self._thread_cpu(threading.get_native_id()) or 0.0

    def summary(self, top: int = 25) -> dict:
        by_cat: collections.Counter = collections.Counter()
        by_leaf: collections.Counter = collections.Counter()
        inclusive: collections.Counter = collections.Counter()
        for stack, cpu in self.stacks.items():
            by_cat[categorise(stack)] += cpu
            by_leaf[_short(stack[0])] += cpu
            for frame in set(stack):
                if any(n in frame for n in INCLUSIVE):
                    inclusive[_short(frame)] += cpu
        python_cpu = sum(by_cat.values())
        by_cat["profiler itself"] = self.own_cpu_s
        by_cat["unattributed (non-Python threads: Arrow, zstd; thread tails)"] = max(
            0.0, self.process_cpu_s - python_cpu - self.own_cpu_s)
        return {"process_cpu_s": self.process_cpu_s,
                "categories": dict(by_cat.most_common()),
                "leaf_functions": dict(by_leaf.most_common(top)),
                "inclusive": dict(inclusive.most_common(top))}


def _thread_cpu(ident: int) -> float | None:
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except OSError:   # the thread just ended
        return None


def _short(frame: str) -> str:
    path, _, func = frame.rpartition(":")
    parts = path.split("/")
    return "/".join(parts[-2:]) + ":" + func


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "-m":
        print(__doc__, file=sys.stderr)
        return 2
    out, module = argv[0], argv[2]
    sys.argv = [module, *argv[3:]]
    sampler = CpuSampler().start()
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sampler.stop()
        with open(out, "w", encoding="utf-8") as fh:
            json.dump(sampler.summary(), fh, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Start and control a sandbox subprocess: for tests, the demo and the benchmarks.

    with SandboxProcess(tmp / "sb.db", key="sk-test", balance=10.0) as sb:
        requests.post(sb.base_url + "/embeddings", ...)

The child is `sys.executable -m service.sandbox` on a free loopback port; its log goes to
`<db>.log` (never a key: the sandbox logs fingerprints). The key travels in argv, which is
acceptable for a test server only.

A renewable one (tests) can be handed on: `SandboxProcess(db2, ...).start_in(spare)` serves a new
sandbox of the new arguments in spare's process (--control-stdin), on its port, without the ~0.5 s
of a process's start.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO, Any
from collections.abc import Sequence

from .store import read_ledger

_REPO_ROOT = str(Path(__file__).resolve().parents[2])
# Loopback health checks must never go through an HTTP(S)_PROXY from the environment.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class SandboxError(RuntimeError):
    """The sandbox did not start or stop as asked; the message carries the end of its log."""


class SandboxProcess:
    def __init__(self, db: str | os.PathLike[str], key: str | None = "sk-test", balance: float | None = 1000.0,
                 budget: float | None = None, args: Sequence[str] = (), port: int = 0,
                 host: str = "127.0.0.1", start_timeout_s: float = 30.0, renewable: bool = False):
        self.db = str(db)
        self.host = host
        self._key, self._balance, self._budget = key, balance, budget
        self._args = [str(a) for a in args]
        self._requested_port = port
        self._start_timeout_s = start_timeout_s
        self._renewable = renewable
        self.port: int | None = None
        self.log_path = self.db + ".log"
        self._ready_file = self.db + ".ready"
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_fh: IO[bytes] | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise SandboxError("the sandbox has not been started")
        return f"http://{self.host}:{self.port}/v1"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def _argv(self, port: int) -> list[str]:
        argv = [sys.executable, "-m", "service.sandbox", "--host", self.host, "--port", str(port),
                "--db", self.db, "--ready-file", self._ready_file]
        if self._key is not None:
            argv += ["--key", self._key]
            if self._balance is not None:   # else the sandbox says --key needs --balance
                argv += ["--balance", repr(float(self._balance))]
            if self._budget is not None:
                argv += ["--budget", repr(float(self._budget))]
        return argv + (["--control-stdin"] if self._renewable else []) + self._args

    def start(self) -> SandboxProcess:
        if self.running():
            raise SandboxError("the sandbox is already running")
        port = self.port if self.port is not None else self._requested_port
        if os.path.exists(self._ready_file):
            os.remove(self._ready_file)
        self._log_fh = open(self.log_path, "ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_ROOT, env.get("PYTHONPATH")) if p)
        self._proc = proc = subprocess.Popen(self._argv(port), stdout=self._log_fh, stderr=subprocess.STDOUT,
                                             stdin=subprocess.PIPE if self._renewable else subprocess.DEVNULL,
                                             env=env, cwd=_REPO_ROOT)
        try:
            self.port = self._wait_ready(proc)
        except BaseException:
            self.kill()
            raise
        return self

    def start_in(self, spare: SandboxProcess) -> SandboxProcess:
        """Start this sandbox in SPARE's process instead of a new one: once SPARE's sandbox
        answers no request, a new one of this one's arguments serves SPARE's port, its state
        as a new process's (this db, log, faults, capacity, rate limits). SPARE, renewable and
        running, gives its process up to this one, which stops it."""
        if self.running():
            raise SandboxError("the sandbox is already running")
        proc, port = spare._proc, spare.port
        if not (port is not None and spare._renewable and self._renewable and proc is not None and proc.poll() is None
                and proc.stdin is not None and spare.host == self.host
                and self._requested_port in (0, port)):
            raise SandboxError(f"{spare!r} cannot serve {self!r}")
        self._proc, self._log_fh, self.port = proc, spare._log_fh, port
        spare._proc = spare._log_fh = None
        if os.path.exists(self._ready_file):
            os.remove(self._ready_file)
        try:
            proc.stdin.write(json.dumps({"argv": self._argv(port)[3:], "log": self.log_path}).encode() + b"\n")
            proc.stdin.flush()
            self._wait_ready(proc)
        except BaseException:
            self.kill()
            raise
        return self

    def _wait_ready(self, proc: subprocess.Popen[bytes]) -> int:
        deadline = time.monotonic() + self._start_timeout_s
        port: int | None = None
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SandboxError(f"the sandbox exited with {proc.returncode}:\n{self.log_tail()}")
            if port is None and os.path.exists(self._ready_file):
                with open(self._ready_file, encoding="utf-8") as fh:
                    port = json.load(fh)["port"]
            if port is not None and self._healthy(port):
                return port
            time.sleep(0.02)
        raise SandboxError(f"the sandbox was not ready within {self._start_timeout_s} s:\n{self.log_tail()}")

    def _healthy(self, port: int) -> bool:
        try:
            with _DIRECT.open(f"http://{self.host}:{port}/healthz", timeout=2) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within TIMEOUT_S."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout_s)
        self._close_log()

    def kill(self) -> None:
        """SIGKILL: no cleanup, as a crash would leave it."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._close_log()

    def restart(self) -> SandboxProcess:
        """Stop if running, then start again on the same port and database."""
        self.stop()
        return self.start()

    def _close_log(self) -> None:
        if self._proc is not None and self._proc.stdin is not None:
            self._proc.stdin.close()
        if self._log_fh:
            self._log_fh.close()
            self._log_fh = None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                fh.seek(max(0, os.path.getsize(self.log_path) - n_bytes))
                return fh.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def ledger(self) -> list[dict[str, Any]]:
        """The ledger rows, as `python -m service.sandbox ledger` prints them."""
        return list(read_ledger(self.db))

    def __enter__(self) -> SandboxProcess:
        return self if self.running() else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SandboxProcess(db={self.db!r}, port={self.port}, pid={self.pid})"

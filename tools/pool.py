"""A Beam worker pool on this machine, as a Flink cluster runs Python beside each TaskManager.

`make pool-up` (`python -m tools.pool up`) starts `apache_beam.runners.worker.worker_pool_main`
on the project's .venv, listening on POOL_PORT (default 50000, the port of
configs/profiles/prism-pool.yaml), and records its pid in `.pool/pids.json` as
`{"worker_pools": [PID, ...]}`; its log is `.pool/worker_pool-PORT.log`, its workers'
semi-persistent directory `.pool/workers/` (removed with the last pool). Run again, it starts
only what is missing: a recorded pool that still runs is kept, one that died is replaced.
`make pool-down` stops exactly the recorded pids (and the SDK workers each started: the pool is
a process group of its own) and nothing else; with POOL_PORT, only the recorded pool on that
port. `python -m tools.pool stopped` exits 1 while a recorded pool runs (`make clean` removes
.pool and the .venv the pool runs on only when none does). POOL_DIR puts that state elsewhere
(tests).

The pool starts each SDK worker as the SDK container's pool does, booted with the job's options
(tools/worker_boot.py: FileSystems, log levels, pickler), with the pool's own environment:
EMBEDDINGS_API_KEY reaches the workers only when it is in the environment of `make pool-up`
(else they need --api-key-file on a path they read, or --api-key-secret). A pid is stopped only
while its command line is still a worker pool's: a pid the system gave to another process since
is left alone.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STATE = ROOT / ".pool"
MODULE = "apache_beam.runners.worker.worker_pool_main"
KEY_VAR = "EMBEDDINGS_API_KEY"
DEFAULT_PORT = 50000   # configs/profiles/prism-pool.yaml's --environment_config
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0


def _pids_file(state: Path) -> Path:
    return state / "pids.json"


def recorded(state: Path = STATE) -> list[int]:
    try:
        return [int(p) for p in json.loads(_pids_file(state).read_text())["worker_pools"]]
    except FileNotFoundError:
        return []


def _record(state: Path, pids: list[int]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    tmp = _pids_file(state).with_suffix(".tmp")
    tmp.write_text(json.dumps({"worker_pools": pids}) + "\n")
    os.replace(tmp, _pids_file(state))


def _command_line(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def port_of(pid: int) -> int | None:
    """The port of a running worker pool PID; None when PID is not one (gone, or another process)."""
    args = _command_line(pid)
    if MODULE not in args:
        return None
    for i, arg in enumerate(args):
        if arg.startswith("--service_port="):
            return int(arg.split("=", 1)[1])
        if arg == "--service_port" and i + 1 < len(args):
            return int(args[i + 1])
    return None


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


def worker_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """ENV (default: this one) with the interpreter's bin first in PATH: the pool runs `python`."""
    env = dict(os.environ if env is None else env)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _workers_dir(state: Path) -> Path:
    return state / "workers"


def _boot(state: Path) -> Path:
    """The executable the pool starts each worker with: tools/worker_boot.py on this interpreter,
    its semi-persistent directory in STATE."""
    boot, workers = state / "boot", _workers_dir(state)
    workers.mkdir(exist_ok=True)
    boot.write_text(f'#!/bin/sh\ncd "{ROOT}" && exec "{sys.executable}" -m tools.worker_boot '
                    f'--semi_persistent_directory="{workers}" "$@"\n')
    boot.chmod(0o755)
    return boot


def start(port: int, state: Path = STATE, env: dict[str, str] | None = None) -> int:
    """A worker pool on PORT (its own process group), once it listens; its pid is added to STATE."""
    state.mkdir(parents=True, exist_ok=True)
    log = state / f"worker_pool-{port}.log"
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-m", MODULE, f"--service_port={port}",
                                 f"--container_executable={_boot(state)}"], stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, env=worker_env(env), cwd=state,
                                start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while not listening(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_pid(proc.pid)
            raise SystemExit(f"the worker pool did not start on port {port}: {log.read_text()[-1500:]}")
        time.sleep(0.1)
    _record(state, [p for p in recorded(state) if port_of(p) is not None] + [proc.pid])
    return proc.pid


def up(port: int, state: Path = STATE, env: dict[str, str] | None = None) -> list[int]:
    """A pool on PORT unless a recorded one runs there: the pids recorded afterwards."""
    alive = [p for p in recorded(state) if port_of(p) is not None]
    if port not in {port_of(p) for p in alive}:
        if not _closes(port):
            raise SystemExit(f"port {port} is taken by a process .pool/pids.json does not know: "
                             f"choose another with POOL_PORT=N")
        start(port, state, env)
    else:
        _record(state, alive)
    return recorded(state)


def _closes(port: int, within_s: float = 5.0) -> bool:
    """Whether PORT is free, or becomes free soon: a pool just killed holds it until its last
    thread has exited, a moment after its pid is gone."""
    deadline = time.monotonic() + within_s
    while listening(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def stop_pid(pid: int) -> None:
    """PID's process group, the pool and the SDK workers it started: SIGINT first (the pool then
    stops its workers itself), SIGKILL to what is left after STOP_TIMEOUT_S."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while _group_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    _group_alive(pid)


def _group_alive(pgid: int) -> bool:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pgid, os.WNOHANG)   # a pool this process started and that exited: reaped, so it is gone
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def down(state: Path = STATE, port: int | None = None) -> list[int]:
    """Stops the recorded pools that still run (their pids checked first), or only the one on
    PORT; the pids it stopped."""
    alive = [p for p in recorded(state) if port_of(p) is not None]
    stopped = [p for p in alive if port is None or port_of(p) == port]
    for pid in stopped:
        stop_pid(pid)
    if kept := [p for p in alive if p not in stopped]:
        _record(state, kept)
    else:   # no pool left whose workers use it
        with contextlib.suppress(FileNotFoundError):
            _pids_file(state).unlink()
        shutil.rmtree(_workers_dir(state), ignore_errors=True)
    return stopped


def main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    given = os.environ.get("POOL_PORT")
    state = Path(os.environ.get("POOL_DIR", STATE))
    if command == "up":
        port = int(given or DEFAULT_PORT)
        if not os.environ.get(KEY_VAR, "").strip():
            print(f"note: {KEY_VAR} is not set here, so the pool's workers have no key in their environment: runs "
                  "on it need --api-key-file PATH on a path they read, or --api-key-secret NAME", file=sys.stderr)
        pids = up(port, state)
        print(f"worker pool on localhost:{port} (pids {pids} in {_pids_file(state)}; "
              f"log {state / f'worker_pool-{port}.log'})")
        return 0
    if command == "stopped":   # make clean, before it removes .venv and .pool
        if running := [p for p in recorded(state) if port_of(p) is not None]:
            print(f"a worker pool runs on this .venv (pids {running} in {_pids_file(state)}): stop it first with "
                  "make pool-down", file=sys.stderr)
            return 1
        return 0
    if command == "down":
        stopped = down(state, int(given) if given else None)
        print(f"stopped worker pool pids {stopped}" if stopped else "no worker pool was running")
        return 0
    print(f"usage: python -m tools.pool up|down|stopped   (POOL_PORT: up's default {DEFAULT_PORT}, down's every pool; "
          "POOL_DIR, default .pool)",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

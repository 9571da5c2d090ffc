"""A Beam worker pool on this machine, as a Flink cluster runs Python beside each TaskManager.

`make pool-up` (`python -m tools.pool up`) starts a pool on the project's .venv listening on
localhost (127.0.0.1 and ::1; POOL_HOST binds another address, docs/RUNNERS.md says what that
exposes), port POOL_PORT (default 50000, the port of configs/profiles/prism-pool.yaml), and
records it in `.pool/pids.json` as `{"worker_pools": [PID, ...], "started": {"PID": TICKS}}`;
its log is `.pool/worker_pool-PORT.log`, its workers' semi-persistent directory `.pool/workers/`
(removed with the last pool). Run again, it starts only what is missing: a recorded pool that
still runs is kept, one that died is replaced. `make pool-down` stops the recorded pools that
still run (and the SDK workers each started: the pool is a process group of its own) and
nothing else; with POOL_PORT, only the one on that port. `python -m tools.pool stopped` exits 1
while a recorded pool runs (`make clean` removes .pool and the .venv the pool runs on only when
none does). POOL_DIR puts that state elsewhere, for the launcher too.

A recorded pid counts as this state's pool only while it is this user's process, its command
line names this state directory, its start time is the recorded one and it runs from this
checkout (pipeline/workerpool.py): a pid the system gave to another process since, another
checkout's pool among them, is neither kept nor stopped. The state directory must be this
user's alone to write.

The pool is Beam's worker pool servicer (`worker_pool_main`'s) that starts a worker only for a
job a launcher admitted to this state, and holds no API key: an admitted job's worker gets its
launcher's key in its own environment. Each worker is booted as the SDK container's pool boots
it, with the job's options (tools/worker_boot.py: FileSystems, log levels, pickler), the pool's
environment otherwise, and no shell between.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from apache_beam.portability.api import beam_fn_api_pb2

from pipeline import workerpool
from pipeline.exits import UsageError
from service.credentials import ENV_VAR

ROOT = Path(__file__).resolve().parents[1]   # the checkout, which the pool and its workers run from
STATE = ROOT / ".pool"
DEFAULT_PORT = 50000   # configs/profiles/prism-pool.yaml's --environment_config
DEFAULT_HOST = "localhost"
START_TIMEOUT_S = 60.0
READY = b"worker pool serving "   # the pool's line once every address is bound
STOP_TIMEOUT_S = 15.0


def _reach(host: str) -> str:
    """Where this machine reaches a server bound to HOST."""
    return "127.0.0.1" if host in ("", "localhost", "0.0.0.0", "::") else host.strip("[]")


def listening(port: int, host: str = DEFAULT_HOST) -> bool:
    with contextlib.suppress(OSError), socket.create_connection((_reach(host), port), timeout=1):
        return True
    return False


def pool_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """ENV (default: this one) without the API key: the pool holds none."""
    return {k: v for k, v in (os.environ if env is None else env).items() if k != ENV_VAR}


def _workers_dir(state: Path) -> Path:
    return state / "workers"


def start(port: int, state: Path = STATE, env: dict[str, str] | None = None, host: str = DEFAULT_HOST) -> int:
    """A pool on HOST:PORT (its own process group), once it serves there; recorded in STATE."""
    state = state.absolute()
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not workerpool.private(state, 0o022):   # whoever writes it could admit jobs
        raise SystemExit(f"{state} is not yours alone (a link, another user's, or others write it): a pool there could run "
                         "jobs of other users; choose a directory of yours alone with POOL_DIR=DIR")
    log = state / f"worker_pool-{port}.log"
    with _private_file(log) as fh:
        offset = fh.tell()
        proc = subprocess.Popen([sys.executable, *workerpool.serve_args(state, host, port)], stdin=subprocess.DEVNULL,
                                stdout=fh, stderr=subprocess.STDOUT, env=pool_env(env), cwd=ROOT,
                                start_new_session=True)
    pool = {proc.pid: workerpool.started(proc.pid)}
    deadline = time.monotonic() + START_TIMEOUT_S
    while READY not in log.read_bytes()[offset:]:   # a port that listens may be another's, or half bound
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_pid(proc.pid)
            raise SystemExit(f"the worker pool did not start on port {port}: {log.read_text()[-1500:]}")
        time.sleep(0.1)
    times = workerpool.recorded(state)
    workerpool.record(state, {**{p: times[p] for p in workerpool.running(state)}, **pool})
    return proc.pid


def _private_file(path: Path) -> Any:
    """PATH open to append, this user's alone to read and write whatever the umask."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    os.fchmod(fd, 0o600)
    return os.fdopen(fd, "ab")


def up(port: int, state: Path = STATE, env: dict[str, str] | None = None, host: str = DEFAULT_HOST) -> list[int]:
    """A pool on PORT unless one of STATE runs there: the pids recorded afterwards."""
    state = state.absolute()
    alive = workerpool.running(state)
    if port not in alive.values():
        if not _closes(port, host):
            raise SystemExit(f"port {port} is taken by a process {state / 'pids.json'} does not know: "
                             f"choose another with POOL_PORT=N")
        start(port, state, env, host)
    else:
        times = workerpool.recorded(state)
        workerpool.record(state, {p: times[p] for p in alive})
    return list(workerpool.recorded(state))


def _closes(port: int, host: str, within_s: float = 5.0) -> bool:
    """Whether PORT is free, or becomes free soon: a pool just killed holds it until its last
    thread has exited, a moment after its pid is gone."""
    deadline = time.monotonic() + within_s
    while listening(port, host):
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
    """Stops STATE's pools that still run (each checked first), or only the one on PORT; the
    pids it stopped."""
    state = state.absolute()
    alive = workerpool.running(state)
    stopped = [p for p, q in alive.items() if port is None or q == port]
    for pid in stopped:
        stop_pid(pid)
    times = workerpool.recorded(state)
    if kept := {p: times[p] for p in alive if p not in stopped}:
        workerpool.record(state, kept)
    else:   # no pool left whose workers use them
        with contextlib.suppress(FileNotFoundError):
            (state / "pids.json").unlink()
        shutil.rmtree(_workers_dir(state), ignore_errors=True)
        workerpool.forget(state)
    return stopped


class _Pool(workerpool.Servicer):
    """Each admitted worker a process: tools/worker_boot.py on this interpreter, from the
    checkout, with the admission's environment (the key) added to the pool's."""

    def __init__(self, state: Path):
        super().__init__(lambda request: workerpool.take(state, request), use_process=True)
        self._workers = _workers_dir(state)

    def start_worker(self, request: beam_fn_api_pb2.StartWorkerRequest,
                     env: dict[str, str]) -> beam_fn_api_pb2.StartWorkerResponse:
        command = [sys.executable, "-m", "tools.worker_boot", f"--semi_persistent_directory={self._workers}",
                   f"--id={request.worker_id}", f"--provision_endpoint={request.provision_endpoint.url}",
                   f"--control_endpoint={request.control_endpoint.url}",
                   f"--logging_endpoint={request.logging_endpoint.url}",
                   f"--artifact_endpoint={request.artifact_endpoint.url}"]
        try:
            print(f"starting worker {request.worker_id}", flush=True)
            # Beam's StopWorker stops the process it finds here
            self._worker_processes[request.worker_id] = subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env}, stdin=subprocess.DEVNULL)
            return beam_fn_api_pb2.StartWorkerResponse()
        except Exception:
            return beam_fn_api_pb2.StartWorkerResponse(error=traceback.format_exc())


def serve(state: Path, host: str, port: int) -> None:
    """The pool itself (`start` runs it): serves until SIGINT."""
    # the workers load what it holds (staged/, a pickled main session): this user's alone
    _workers_dir(state).mkdir(mode=0o700, exist_ok=True)
    _workers_dir(state).chmod(0o700)
    address, server = workerpool.serve(_Pool(state), host, port)
    print(f"{READY.decode()}{address} for {state}", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.wait_for_termination()
    server.stop(0)


def _serve_args(argv: list[str]) -> Any:
    ap = argparse.ArgumentParser(prog="python -m tools.pool serve")
    ap.add_argument("--state", type=Path, required=True)
    ap.add_argument("--host", required=True)
    ap.add_argument("--port", type=int, required=True)
    return ap.parse_args(argv)


def main(argv: list[str]) -> int:
    try:
        return _main(argv)
    except UsageError as exc:   # its state unreadable: one line
        print(exc, file=sys.stderr)
        return 1


def _main(argv: list[str]) -> int:
    command = argv[0] if argv else ""
    given = os.environ.get("POOL_PORT", "")
    state = Path(os.environ.get(workerpool.STATE_VAR) or STATE).absolute()
    if command == "serve":
        args = _serve_args(argv[1:])
        serve(args.state, args.host, args.port)
        return 0
    if given and not given.isdigit():
        print(f"POOL_PORT={given}: not a port number", file=sys.stderr)
        return 2
    if os.path.lexists(state) and not workerpool.private(state, 0o022):
        print(f"{state} is not yours alone (a link, another user's, or others write it): a pool there could run jobs of "
              "other users; choose a directory of yours alone with POOL_DIR=DIR", file=sys.stderr)
        return 1
    if command == "up":
        port, host = int(given or DEFAULT_PORT), os.environ.get("POOL_HOST") or DEFAULT_HOST
        if os.environ.get(ENV_VAR, "").strip():
            print(f"note: the pool does not take {ENV_VAR}: each job's worker gets the key of the launcher that "
                  "started the job", file=sys.stderr)
        pids = up(port, state, host=host)
        print(f"worker pool on {workerpool.address(host, port)} (pids {pids} in {state / 'pids.json'}; "
              f"log {state / f'worker_pool-{port}.log'})")
        return 0
    if command == "stopped":   # make clean, before it removes .venv and .pool
        if alive := list(workerpool.running(state)):
            print(f"a worker pool runs on this .venv (pids {alive} in {state / 'pids.json'}): stop it first with "
                  "make pool-down", file=sys.stderr)
            return 1
        return 0
    if command == "down":
        stopped = down(state, int(given) if given else None)
        print(f"stopped worker pool pids {stopped}" if stopped else "no worker pool was running")
        return 0
    print(f"usage: python -m tools.pool up|down|stopped   (POOL_PORT: up's default {DEFAULT_PORT}, down's every pool; "
          "POOL_HOST: up's default localhost; POOL_DIR, default .pool)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Whose a worker pool on this machine is, and which workers it may start: what the launcher
(pipeline/prism.py) and `make pool-up` (tools/pool.py) agree on.

A pool of this checkout is the process `python -m tools.pool serve --state=STATE ...` run from
the checkout, recorded with its start time in STATE/pids.json (STATE: $POOL_DIR, else the
checkout's .pool). A recorded pid whose command line, start time or directory differ is another
process (the system reuses pids), and is neither adopted nor stopped.

A pool holds no API key, and starts a worker only for a job a launcher of its STATE admitted
to it: between Prism's Prepare and Run the launcher writes STATE/jobs/NAME.json (the directory
0700, the file 0600): its own pid and start time, Prism's address, the job's id and, when the
launcher's key comes from its environment, that key. Prism names the worker of job J `J[...]_ENV`
and gives its own address (as its Prepare response names it) as every endpoint of the
StartWorker request. The pool starts the worker
of a request that matches an admission, once (the admission is deleted as it is taken), with the
key in that worker's environment only; any other request (a StartWorker from elsewhere, a job
someone else submitted to the same Prism, a launcher that died) is refused before anything of
it runs. Whoever writes STATE could admit jobs: the pool and the launcher refuse a STATE that
other users write, and an admission counts only in a directory and a file no one else reads.
"""
from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import grpc
from apache_beam.options.pipeline_options import PortableOptions
from apache_beam.portability.api import beam_fn_api_pb2, beam_fn_api_pb2_grpc
from apache_beam.runners.worker import worker_pool_main
from apache_beam.utils import thread_pool_executor

from pipeline.exits import UsageError
from service.credentials import ENV_VAR

ROOT = Path(__file__).resolve().parents[1]   # the checkout
STATE_VAR = "POOL_DIR"
SERVE = ["-m", "tools.pool", "serve"]        # a pool's command line after its interpreter
_LOGGER = logging.getLogger(__name__)
IP = ipaddress.IPv4Address | ipaddress.IPv6Address
Admits = Callable[[beam_fn_api_pb2.StartWorkerRequest], dict[str, str] | None]


def state_dir() -> Path:
    return Path(os.environ.get(STATE_VAR) or ROOT / ".pool").absolute()


def started(pid: int) -> int | None:
    """PID's start time (clock ticks since boot); None when no such process runs."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def private(path: Path, others: int = 0o077) -> bool:
    """Whether PATH is this user's, with none of the OTHERS permission bits (0o022: no one else
    writes it; 0o077: no one else reads it either), and no link (whoever made a link in a
    directory others write, /tmp, may point it elsewhere at any time)."""
    try:
        st = path.lstat()
    except OSError:
        return False
    return st.st_uid == os.getuid() and not st.st_mode & others


def _pids_file(state: Path) -> Path:
    return state / "pids.json"


def recorded(state: Path) -> dict[int, int | None]:
    """STATE's recorded pools: pid -> start time (None for a record that has none)."""
    try:
        data = json.loads(_pids_file(state).read_text())
        times = data.get("started", {})
        return {int(p): times.get(str(p)) for p in data["worker_pools"]}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as exc:   # cut short, or edited
        raise UsageError(f"{_pids_file(state)} is no record of worker pools ({type(exc).__name__}: {exc}): stop its "
                         "pools by their pids (ps -eo pid,args | grep 'tools.pool serve'), then remove it") from None


def record(state: Path, pools: dict[int, int | None]) -> None:
    """`{"worker_pools": [PID, ...], "started": {"PID": TICKS}}`, replaced at once."""
    state.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = _pids_file(state).with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)   # others write it not, whatever the umask
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"worker_pools": list(pools), "started": {str(p): t for p, t in pools.items()}}) + "\n")
    os.replace(tmp, _pids_file(state))


def serve_args(state: Path, host: str, port: int) -> list[str]:
    return [*SERVE, f"--state={state}", f"--host={host}", f"--port={port}"]


def port_of(pid: int, state: Path, start: int | None) -> int | None:
    """The port of PID when it is this user's pool of STATE started at START from this checkout;
    else None."""
    try:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[1:-1]
        cwd, owner = os.readlink(f"/proc/{pid}/cwd"), os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None
    if (start is None or started(pid) != start or owner != os.getuid() or cwd != str(ROOT)
            or args[:4] != [*SERVE, f"--state={state}"]):
        return None
    port = args[-1].removeprefix("--port=")
    return int(port) if port.isdigit() else None


def running(state: Path) -> dict[int, int]:
    """STATE's recorded pools that still run: pid -> port."""
    found = {pid: port_of(pid, state, start) for pid, start in recorded(state).items()}
    return {pid: port for pid, port in found.items() if port is not None}


def split_address(address: str) -> tuple[str, int | None]:
    """HOST:PORT as (host, port); port None when it is not a number."""
    host, _, port = address.rpartition(":")
    return host, int(port) if port.isdigit() else None


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def address(host: str, port: int) -> str:
    """HOST:PORT as a runner on this machine names a server bound there."""
    return _join("localhost" if host in ("", "0.0.0.0", "::") else host, port)


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


def _bind(server: grpc.Server, host: str, port: int) -> int:
    """HOST:PORT on SERVER, localhost as 127.0.0.1 and ::1 both or not at all: gRPC binds what
    it can of a name's addresses, and another process listening on ::1 there would then take
    the connections made to localhost that try ::1 first. Raises when an address is taken."""
    if host != "localhost":
        return int(server.add_insecure_port(_join(host, port)))
    bound = int(server.add_insecure_port(f"127.0.0.1:{port}"))
    if _ipv6_loopback():
        server.add_insecure_port(f"[::1]:{bound}")
    return bound


def serve(servicer: beam_fn_api_pb2_grpc.BeamFnExternalWorkerPoolServicer, host: str = "localhost",
          port: int = 0) -> tuple[str, grpc.Server]:
    """SERVICER on HOST:PORT (localhost: 127.0.0.1 and ::1), where Beam's worker_pool_main serves
    it on every interface. No SO_REUSEPORT: a second server on the port fails rather than sharing
    its connections. The address to give the runner."""
    server = grpc.server(thread_pool_executor.shared_unbounded_instance(),
                         options=[("grpc.http2.max_pings_without_data", 0), ("grpc.http2.max_ping_strikes", 0),
                                  ("grpc.so_reuseport", 0)])
    bound = _bind(server, host, port)
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(servicer, server)
    server.start()
    return address(host, bound), server


class Servicer(worker_pool_main.BeamFnExternalWorkerPoolServicer):
    """Beam's worker pool servicer that starts a worker only when ADMITS takes its request (the
    environment to add to the worker's), and refuses any other request before it starts anything."""

    def __init__(self, admits: Admits, **kwargs: Any):
        super().__init__(**kwargs)
        self._admits = admits

    def StartWorker(self, request: beam_fn_api_pb2.StartWorkerRequest,
                    context: Any) -> beam_fn_api_pb2.StartWorkerResponse:
        env = self._admits(request)
        if env is None:
            _LOGGER.warning("refused worker %r: no job admitted to this pool has it", request.worker_id)
            return beam_fn_api_pb2.StartWorkerResponse(
                error=f"worker {request.worker_id!r} refused: this pool starts workers only for the jobs its "
                      "launchers admitted (python -m pipeline from its checkout, with its POOL_DIR)")
        return self.start_worker(request, env)

    def start_worker(self, request: beam_fn_api_pb2.StartWorkerRequest,
                     env: dict[str, str]) -> beam_fn_api_pb2.StartWorkerResponse:
        """Beam's: a worker thread (or process) with this process's environment."""
        response: beam_fn_api_pb2.StartWorkerResponse = super().StartWorker(request, None)
        return response


def matches(request: beam_fn_api_pb2.StartWorkerRequest, prism: str, job: str) -> bool:
    """Whether REQUEST starts the worker of JOB of the Prism at PRISM (host:port, exactly as that
    Prism names itself: 127.0.0.1:PORT is not localhost:PORT, which may reach ::1)."""
    endpoints = (request.control_endpoint, request.logging_endpoint, request.provision_endpoint,
                 request.artifact_endpoint)
    return {e.url for e in endpoints} == {prism} and request.worker_id.startswith(f"{job}[")


class OwnJobs:
    """The admissions of a launcher's own worker service (LOOPBACK): in its memory."""

    def __init__(self) -> None:
        self._jobs: set[tuple[str, str]] = set()

    def add(self, prism: str, job: str) -> None:
        self._jobs.add((prism, job))

    def take(self, request: beam_fn_api_pb2.StartWorkerRequest) -> dict[str, str] | None:
        for prism, job in list(self._jobs):
            if matches(request, prism, job):
                self._jobs.discard((prism, job))
                return {}
        return None


def _this_machine(ip: IP) -> bool:
    """Whether IP is an address of this machine's (loopback, or one a socket here can bind)."""
    if ip.is_loopback:
        return True
    try:
        with socket.socket(socket.AF_INET6 if ip.version == 6 else socket.AF_INET) as probe:
            probe.bind((str(ip), 0))
        return True
    except OSError:
        return False


def _dialed(ip: IP) -> IP:
    """Where a connection to IP goes: an IPv4 address mapped into IPv6 is that address, and no
    address (0.0.0.0, ::) is loopback."""
    ip = getattr(ip, "ipv4_mapped", None) or ip
    if ip.is_unspecified:
        return ipaddress.ip_address("127.0.0.1" if ip.version == 4 else "::1")
    return ip


def local_addresses(host: str) -> set[IP]:
    """The addresses of this machine that a runner dialing HOST reaches; none for a host
    elsewhere. Of names, only localhost and this machine's own are looked up (no lookup leaves it)."""
    name = host.strip("[]")
    try:
        found = {ipaddress.ip_address(name.split("%")[0])}
    except ValueError:
        if name not in ("localhost", socket.gethostname()):
            return set()
        try:
            found = {ipaddress.ip_address(str(info[4][0]).split("%")[0])
                     for info in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)}
        except OSError:
            return set()
    return {ip for ip in map(_dialed, found) if _this_machine(ip)}


def _covers(pool_host: str, ip: IP) -> bool:
    """Whether a pool bound to POOL_HOST (tools/pool.py `serve`'s --host) listens at IP."""
    if pool_host == "localhost":
        return str(ip) in ("127.0.0.1", "::1")
    if pool_host in ("0.0.0.0", "::"):
        return ip.version == 4 or pool_host == "::"
    return ip in local_addresses(pool_host)


def _host_of(pid: int) -> str:
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    return next((a.removeprefix("--host=") for a in args if a.startswith("--host=")), "")


def own_pool(portable: PortableOptions) -> Path | None:
    """The state directory of the pool EXTERNAL workers come from when it is this checkout's;
    None for workers of no pool or of a pool elsewhere. A pool on this machine (at any of its
    addresses, 127.0.0.2 and 0.0.0.0 as well as localhost) that is not this checkout's is a
    usage error: its workers would run another checkout's code."""
    config = portable.environment_config
    host, port = split_address(config or "")
    if portable.environment_type != "EXTERNAL" or port is None:
        return None
    state = state_dir()
    if os.path.lexists(state) and not private(state, 0o022):
        raise UsageError(f"the worker pools' directory {state} is not yours alone (a link, another user's, or others "
                         "write it): a pool there could run jobs of other users. Start this checkout's pool with "
                         "POOL_DIR=DIR, a directory of yours alone, and run with the same POOL_DIR")
    if not (here := local_addresses(host)):
        return None   # a pool elsewhere: its owner's
    with contextlib.suppress(OSError):   # a pool that ended meanwhile
        for host_of_ours in (_host_of(p) for p, q in running(state).items() if q == port):
            if all(_covers(host_of_ours, ip) for ip in here):
                return state
            raise UsageError(f"--environment_config {config}: this checkout's worker pool on port {port} listens on "
                             f"{host_of_ours} alone, and {host} may reach another listener on the same port (at "
                             f"{', '.join(sorted(map(str, here)))}): pass --environment_config "
                             f"{address(host_of_ours, port)}")
    with socket.socket(socket.AF_INET6 if (dialed := min(here, key=str)).version == 6 else socket.AF_INET) as probe:
        if probe.connect_ex((str(dialed), port)):
            raise UsageError(f"--environment_config {config}: no worker pool runs on port {port}: start this "
                             f"checkout's with `POOL_PORT={port} make pool-up` (in {ROOT})")
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        other = free.getsockname()[1]
    raise UsageError(f"--environment_config {config}: the worker pool on port {port} is not this checkout's "
                     f"({ROOT}, its pools in {state / 'pids.json'}): its workers would run another checkout's code. "
                     f"Start this checkout's on a free port (`POOL_PORT={other} make pool-up`) and pass "
                     f"--environment_config localhost:{other}")


def _jobs_dir(state: Path) -> Path:
    return state / "jobs"


def admit(state: Path, prism: str, job: str, key: str | None) -> Path:
    """JOB of the Prism at PRISM admitted to STATE's pools, with KEY for its worker: the file
    to delete once the job has ended. Admissions of launchers that died are deleted first."""
    jobs = _jobs_dir(state)
    jobs.mkdir(mode=0o700, parents=True, exist_ok=True)
    jobs.chmod(0o700)
    for found in _admissions(state):
        _alive(found)
    path = jobs / f"{secrets.token_hex(8)}.json"
    admission = {"launcher": os.getpid(), "started": started(os.getpid()), "prism": prism, "job": job}
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump({**admission, **({"key": key} if key else {})}, fh)
    return path


class _Admission(NamedTuple):
    path: Path
    launcher: int
    started: int | None
    prism: str
    job: str
    key: str | None


def _admission(path: Path) -> _Admission | None:
    """The admission in PATH when this user alone could have written it (and it is whole)."""
    if not private(path):
        return None
    try:
        data = json.loads(path.read_text())
        return _Admission(path, int(data["launcher"]), data["started"], str(data["prism"]), str(data["job"]),
                          data.get("key"))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _admissions(state: Path) -> Iterator[_Admission]:
    jobs = _jobs_dir(state)
    if private(jobs):
        yield from filter(None, map(_admission, sorted(jobs.glob("*.json"))))


def _alive(found: _Admission) -> bool:
    """Whether FOUND's launcher still runs; its admission deleted when not (it may hold the key)."""
    if started(found.launcher) == found.started:
        return True
    found.path.unlink(missing_ok=True)
    return False


def take(state: Path, request: beam_fn_api_pb2.StartWorkerRequest) -> dict[str, str] | None:
    """The environment for REQUEST's worker when a live launcher admitted its job to STATE (the
    admission deleted: taken once); None otherwise. Admissions of launchers gone are deleted."""
    for found in _admissions(state):
        if not _alive(found):
            continue
        if matches(request, found.prism, found.job):
            try:
                found.path.unlink()
            except FileNotFoundError:   # another request took it first
                continue
            return {ENV_VAR: found.key} if found.key else {}
    return None


def forget(state: Path) -> None:
    """Every admission in STATE: no pool is left to take them."""
    for path in _jobs_dir(state).glob("*.json"):
        path.unlink(missing_ok=True)

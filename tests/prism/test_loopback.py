"""Where a run on Prism listens, and where its launcher and workers reach it, looked at mid-run
(psutil): every socket of Prism (and of any process it starts) on 127.0.0.1, LOOPBACK and with a
pool's workers, and every connection to Prism's port made to the address it bound, never to a
name; --prism_host binds it elsewhere (127.0.0.2, ::1 with a pool's workers); a listener on ::1 at Prism's port (another
user's) gets nothing. Beam's own Prism (no -job_host) listens on every interface and names
localhost: each test fails on it."""
from __future__ import annotations

import ipaddress
import json
import os
import socket

import psutil
import pytest

from tests.e2e.helpers import corpus_rows, write_corpus
from tests.prism.test_faults import Job
from tests.prism.twin import Side, env_for, wait_until

MODEL = "text-embedding-3-small"


def _ip(address) -> str:
    """ADDRESS's IP (an IPv4 address mapped into IPv6 as IPv4)."""
    ip = ipaddress.ip_address(address.ip.split("%")[0])
    return str(getattr(ip, "ipv4_mapped", None) or ip)


def _prism(launcher: int, binary: str) -> psutil.Process:
    """The Prism that LAUNCHER started (its wrapper has become Prism: same pid)."""
    found: list[psutil.Process] = []

    def started() -> bool:
        found[:] = [p for p in psutil.Process(launcher).children(recursive=True)
                    if p.exe() == os.path.realpath(binary)]
        return bool(found)

    wait_until(started, 30, "the launcher's Prism")
    [prism] = found
    return prism


def _mid_run(launcher: int, binary: str) -> tuple[set[str], int, list, list]:
    """Prism's listening addresses and port, its (and its children's) sockets, and every socket on
    this machine connected to that port: those who reach Prism."""
    prism = _prism(launcher, binary)
    sockets = [c for p in (prism, *prism.children(recursive=True)) for c in p.net_connections("inet")]
    listening = [c for c in sockets if c.status == psutil.CONN_LISTEN]
    assert listening, sockets
    [port] = {c.laddr.port for c in listening}
    reaching = [c for c in psutil.net_connections("inet") if c.raddr and c.raddr.port == port]
    return {_ip(c.laddr) for c in listening}, port, sockets, reaching


def _flags(variant: str, binary: str, pool) -> list[str]:
    flags = ["--profile", variant, "--prism_location", binary]
    return flags + (["--environment_config", pool.address] if pool else [])


@pytest.mark.parametrize("variant", ["prism", "prism-pool"])
def test_every_socket_of_a_prism_run_is_on_loopback(tmp_path, sandbox_factory, leak_key, prism_binary, own_pool,
                                                     variant):
    pool = own_pool() if variant == "prism-pool" else None
    job = Job(tmp_path, sandbox_factory, leak_key, _flags(variant, prism_binary, pool), pool=pool)
    proc = job.start()
    try:
        listening, port, sockets, reaching = _mid_run(proc.pid, prism_binary)
        assert listening == {"127.0.0.1"}, listening
        ends = [(_ip(c.laddr), c.raddr and _ip(c.raddr)) for c in sockets]
        assert all(ipaddress.ip_address(a).is_loopback for end in ends for a in end if a), ends
        # the launcher, the workers (the launcher's threads, or the pool's processes) and Prism
        # itself dial the address Prism bound: none reaches its port by a name that may try ::1
        assert reaching and {_ip(c.raddr) for c in reaching} == {"127.0.0.1"}, reaching
        assert psutil.Process(proc.pid).net_connections("inet")   # looked at while the job runs
    finally:
        code = proc.wait(120)
    assert code == 0, job.log.read_text()[-3000:]


@pytest.mark.parametrize("host, variant", [("127.0.0.2", "prism"), ("::1", "prism-pool")])
def test_prism_host_binds_prism_elsewhere(tmp_path, sandbox_factory, leak_key, prism_binary, own_pool, host, variant):
    pool = own_pool() if variant == "prism-pool" else None
    job = Job(tmp_path, sandbox_factory, leak_key, [*_flags(variant, prism_binary, pool), "--prism_host", host],
              pool=pool)
    proc = job.start()
    try:
        listening, port, _, reaching = _mid_run(proc.pid, prism_binary)
        assert listening == {host} and {_ip(c.raddr) for c in reaching} == {host}, reaching
    finally:
        code = proc.wait(120)
    assert code == 0, job.log.read_text()[-3000:]
    named = f"[{host}]" if ":" in host else host
    assert json.loads((job.side.out / "summary.json").read_text())["runner"]["prism"] == f"{named}:{port}"


@pytest.mark.parametrize("variant", ["prism", "prism-pool"])
def test_a_listener_on_ipv6_loopback_at_prism_s_port_gets_nothing(tmp_path, sandbox_factory, leak_key, prism_binary,
                                                                   pool, variant):
    """Another user listening on [::1]:PORT first: the run on Prism's PORT completes, and no
    connection (the launcher's, a worker's) reached that listener."""
    with socket.socket(socket.AF_INET6) as squatter:
        squatter.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        squatter.bind(("::1", 0))
        squatter.listen()
        squatter.setblocking(False)
        port = squatter.getsockname()[1]
        env = pool.launcher_env(env_for(leak_key)) if variant == "prism-pool" else env_for(leak_key)
        flags = [*_flags(variant, prism_binary, pool if variant == "prism-pool" else None), "--job_port", str(port)]
        side = Side(variant, tmp_path / "side", sandbox_factory(key=leak_key, balance=1000.0), flags, env, dict,
                    leak_key)
        outcome = side.cli("run", "--input", write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "--output",
                           "{out}", "--model", MODEL, "--base-url", "{base_url}")
        assert outcome.code == 0, outcome.raw_stderr[-3000:]
        with pytest.raises(BlockingIOError):
            squatter.accept()

"""Shared fixtures: sandboxes as real subprocesses on free loopback ports, stopped at teardown."""
from __future__ import annotations

import errno
import os
import random
import shutil
import socket
import subprocess
import tempfile
import uuid
from pathlib import Path

import pytest

from pipeline.outdir.space import free_bytes
from service.sandbox.launcher import SandboxProcess

SANDBOX_KEY = "sk-test-key"
pytest_plugins = ("tests.postgres",)   # the PostgreSQL server of the tests that publish

# Loopback only: a proxy configured in the environment must never see sandbox traffic (or keys).
os.environ["NO_PROXY"] = ",".join(p for p in (os.environ.get("NO_PROXY"), "127.0.0.1", "localhost") if p)


SPARES = 2   # sandbox processes a test process keeps for the next tests


@pytest.fixture(scope="session")
def spare_sandboxes():
    """Running sandbox processes the factory starts the next sandboxes in (start_in: a new
    sandbox each time, in an old process): stopped at the end of the session."""
    spares: list[SandboxProcess] = []
    yield spares
    for sb in spares:
        sb.stop()


@pytest.fixture
def sandbox_factory(tmp_path_factory, spare_sandboxes):
    """Call with SandboxProcess's arguments (db defaults to a fresh temporary file); returns a
    started sandbox, as a new process would start it (in a spare process where one is left,
    SandboxProcess.start_in). One still running at teardown is kept as a spare, else stopped."""
    started: list[SandboxProcess] = []

    def make(db=None, **kwargs) -> SandboxProcess:
        if db is None:
            db = tmp_path_factory.mktemp("sandbox") / "sandbox.db"
        sb = SandboxProcess(db, renewable=True, **kwargs)
        started.append(sb)
        while spare_sandboxes:
            spare = spare_sandboxes.pop()
            if spare.running() and spare.host == sb.host and kwargs.get("port", 0) in (0, spare.port):
                return sb.start_in(spare)
            spare.stop()
        return sb.start()

    yield make
    for sb in started:
        if sb.running() and len(spare_sandboxes) < SPARES:
            spare_sandboxes.append(sb)
        else:
            sb.stop()


@pytest.fixture
def sandbox(sandbox_factory) -> SandboxProcess:
    """A default sandbox: key "sk-test-key", balance 1000 RUB, no budget, no faults."""
    return sandbox_factory(key=SANDBOX_KEY, balance=1000.0)


@pytest.fixture
def disk(tmp_path):
    """Call with a size in MB: a tmpfs of its own (root may mount one), so that DIR is filled
    without filling the machine's disk. Each is unmounted at teardown."""
    mounts: list[Path] = []

    def make(size_mb: int) -> Path:
        mount = tmp_path / f"disk{len(mounts)}"
        mount.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)],
                              capture_output=True, text=True)
        if done.returncode:
            pytest.skip(f"a tmpfs cannot be mounted here ({done.stderr.strip() or done.returncode}): "
                        "the full-disk tests need root or CAP_SYS_ADMIN")
        mounts.append(mount)
        return mount

    yield make
    for mount in mounts:
        subprocess.run(["umount", "-l", str(mount)], check=False)


@pytest.fixture
def small_disk(disk) -> Path:
    """A tmpfs of 6 MB."""
    return disk(6)


def fill(disk: Path, leave: int) -> Path:
    """A file that takes all of DISK's free space but LEAVE bytes (grown again while a run
    writes beside it: an allocation is all or nothing)."""
    filler = disk / f"filler-{uuid.uuid4().hex}"
    with open(filler, "wb") as fh:
        for _ in range(1000):
            if (grow := free_bytes(disk) - leave) <= 0:
                break
            try:
                os.posix_fallocate(fh.fileno(), os.fstat(fh.fileno()).st_size, grow)
            except OSError as exc:
                if exc.errno != errno.ENOSPC:
                    raise
    return filler


def make_free(disk: Path, filler: Path, free: int) -> None:
    """Shrink FILLER until DISK has FREE bytes free (as a user frees space as told)."""
    size = os.path.getsize(filler) - max(0, free - free_bytes(disk))
    assert size >= 0, "the filler is smaller than what must be freed"
    os.truncate(filler, size)


def free_port() -> int:
    """A free loopback port below the kernel's ephemeral range: a server restarted on its port
    after a kill must find it free, and the ports other processes bind to port 0 meanwhile come
    from that range."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    while True:
        port = random.randrange(low // 2, low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def reachable_dir(prefix: str) -> Path:
    """A directory outside pytest's that the embedded PostgreSQL's user can reach, as private as
    pytest's (0700): run as root, that server runs as a user of its own (`publish --to embedded`:
    pipeline/publish/embedded_user.py), which cannot enter pytest-of-root; this directory is
    that user's."""
    from pipeline.publish.embedded_user import as_root, system_user
    path = Path(tempfile.mkdtemp(prefix=prefix))
    if as_root():
        user = system_user()
        os.chown(path, user.uid, user.gid)
    return path


@pytest.fixture
def reachable_tmp():
    """A tmp_path for a DIR whose embedded database runs as another user (reachable_dir)."""
    path = reachable_dir("embedpipe-test-")
    yield path
    shutil.rmtree(path, ignore_errors=True)

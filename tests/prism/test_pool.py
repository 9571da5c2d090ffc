"""`make pool-up` and `make pool-down` (tools/pool.py): a pool starts once and records its pid,
a second `up` starts only what is missing, `down` stops exactly the recorded pids (with the SDK
workers each started; with a port, only the pool on it) and nothing else, and a pid the system
gave to another process (another checkout's pool among them) is neither adopted nor stopped."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from pipeline import prism, workerpool
from pipeline.exits import UsageError
from pipeline.outdir.lock import pid_alive
from tests.e2e.helpers import corpus_rows, write_corpus
from tests.conftest import free_port
from tests.prism.twin import Side, env_for, wait_until
from tools import pool as pools


def test_up_is_idempotent_and_down_stops_exactly_its_pids(tmp_path):
    state, port = tmp_path / ".pool", free_port()
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        first = pools.up(port, state)
        assert json.loads((state / "pids.json").read_text())["worker_pools"] == first and len(first) == 1
        assert pools.up(port, state) == first   # running: nothing started
        os.kill(first[0], signal.SIGKILL)       # died: replaced, and only it (its port free a moment later)
        wait_until(lambda: not workerpool.running(state), 10, "the pool's death")   # gone, or a zombie
        second = pools.up(port, state)
        assert len(second) == 1 and second != first and pools.listening(port)
        assert pools.down(state) == second
        wait_until(lambda: not pools.listening(port), 10, "the pool's port closed")
        assert not pid_alive(second[0]) and bystander.poll() is None   # down reaped it
        assert pools.down(state) == []          # nothing recorded: nothing to stop
    finally:
        bystander.kill()
        pools.down(state)


def test_down_with_a_port_stops_only_the_pool_on_it(tmp_path):
    state, ports = tmp_path / ".pool", (free_port(), free_port())
    try:
        first, second = (pools.start(port, state) for port in ports)
        assert pools.down(state, ports[0]) == [first]
        assert list(workerpool.recorded(state)) == [second] and pools.listening(ports[1])
    finally:
        pools.down(state)


def test_a_recorded_pid_that_is_no_pool_is_left_alone(tmp_path):
    state = tmp_path / ".pool"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        state.mkdir()
        (state / "pids.json").write_text(json.dumps({"worker_pools": [other.pid]}))
        assert pools.down(state) == []
        time.sleep(0.2)
        assert other.poll() is None
    finally:
        other.kill()


def test_a_recorded_pid_of_another_pool_is_neither_adopted_nor_stopped(tmp_path):
    """A recorded pid the system gave since to another checkout's pool (its start time recorded
    as it is), or to any worker_pool_main, after a reboot say."""
    mine, theirs, ports = tmp_path / "mine" / ".pool", tmp_path / "theirs" / ".pool", (free_port(), free_port())
    foreign = pools.start(ports[0], theirs)
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                             "apache_beam.runners.worker.worker_pool_main", f"--service_port={ports[1]}"],
                            start_new_session=True)   # looks like one, listens nowhere
    try:
        mine.mkdir(parents=True)
        pids = [foreign, bare.pid]
        (mine / "pids.json").write_text(json.dumps({"worker_pools": pids,
                                                    "started": {str(p): workerpool.started(p) for p in pids}}))
        assert pools.down(mine) == []
        with pytest.raises(SystemExit, match="taken by a process"):
            pools.up(ports[0], mine)   # the other pool's port: not adopted
        assert bare.pid not in pools.up(ports[1], mine)   # a pool of its own started instead
        assert pools.down(mine) != [] and pools.listening(ports[0]) and bare.poll() is None
    finally:
        bare.kill()
        pools.down(mine)
        pools.down(theirs)


def test_a_checkout_path_with_shell_syntax_is_no_command(tmp_path, monkeypatch):
    """A copy of the tree under a name with $(...), a backquote and a quote: its pool starts a
    worker without running any of it, and a launcher of this checkout refuses that pool."""
    from tests.prism.test_strangers import Runner, start_worker
    copy = tmp_path / "co $(touch PWNED-1) `touch PWNED-2` 'q x"   # a double quote would end sh's parse first
    for part in ("tools", "pipeline", "service", "transforms"):
        shutil.copytree(pools.ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    port, runner = free_port(), Runner()
    env = {k: v for k, v in os.environ.items() if k != workerpool.STATE_VAR}
    pool = lambda command: subprocess.run([sys.executable, "-m", "tools.pool", command], cwd=copy,
                                          env={**env, "POOL_PORT": str(port)}, capture_output=True, text=True,
                                          timeout=120)
    try:
        assert pool("up").returncode == 0
        workerpool.admit(copy / ".pool", runner.address, "job-001", None)
        assert start_worker(f"localhost:{port}", runner.address, "job-001[job]_env").error == ""
        booted = runner.called.wait(60)
        assert not list(tmp_path.rglob("PWNED*")) and not list(pools.ROOT.glob("PWNED*"))
        assert booted and runner.asked == ["job-001[job]_env"]
        monkeypatch.setenv(workerpool.STATE_VAR, str(copy / ".pool"))
        with pytest.raises(UsageError, match="is not this checkout's"):
            prism.own_pool(PipelineOptions(["--runner", "PrismRunner", "--environment_type", "EXTERNAL",
                                            "--environment_config", f"localhost:{port}"]))
    finally:
        runner.stop()
        assert "stopped worker pool pids" in pool("down").stdout


def test_under_umask_000_what_the_pool_writes_stays_its_user_s(tmp_path):
    """A POOL_DIR others may read (0755) and a umask of 000: the pool's record, its log and its
    workers' directory (whose staged/pickled_main_session a worker loads) are written by no one
    else."""
    state, port = tmp_path / "pools", free_port()
    state.mkdir(mode=0o755)
    old = os.umask(0)
    try:
        pools.up(port, state)
    finally:
        os.umask(old)
    try:
        wait_until(lambda: (state / "workers").exists(), 30, "the workers' directory")
        for path, others in ((state / "pids.json", 0o022), (state / f"worker_pool-{port}.log", 0o022),
                             (state / "workers", 0o077)):
            assert path.stat().st_mode & others == 0, (path, oct(path.stat().st_mode))
    finally:
        pools.down(state)


def test_a_record_cut_short_is_one_line_not_a_traceback(tmp_path):
    state = tmp_path / ".pool"
    state.mkdir(mode=0o700)
    (state / "pids.json").write_text('{"worker_pools": [1]}\nx\n')
    env = {**os.environ, "POOL_DIR": str(state)}
    for command in ("down", "up", "stopped"):
        done = subprocess.run([sys.executable, "-m", "tools.pool", command], cwd=pools.ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
        assert done.stderr.count("\n") == done.stderr.count("apitools") + 1   # one line (and Beam's import warnings)
        assert "is no record of worker pools" in done.stderr


def test_a_port_taken_by_another_process_is_refused(tmp_path):
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen()
        with pytest.raises(SystemExit, match="taken by a process"):
            pools.up(port, tmp_path / ".pool")


def test_make_pool_up_and_down(tmp_path):
    """The make targets as a user runs them, on a port of the test's own."""
    env = {**os.environ, "POOL_PORT": str(free_port()), "POOL_DIR": str(tmp_path / ".pool")}
    repo = pools.ROOT
    up = subprocess.run(["make", "-s", "pool-up"], cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        pids = json.loads((tmp_path / ".pool" / "pids.json").read_text())["worker_pools"]
        assert f"localhost:{env['POOL_PORT']}" in up.stdout and list(workerpool.running(tmp_path / ".pool")) == pids
    finally:
        down = subprocess.run(["make", "-s", "pool-down"], cwd=repo, env=env, capture_output=True, text=True,
                              timeout=120)
    assert down.returncode == 0 and f"stopped worker pool pids {pids}" in down.stdout
    assert not any(pid_alive(p) for p in pids)


def test_the_workers_leave_nothing_in_the_temporary_directory(tmp_path, own_pool, sandbox_factory, leak_key,
                                                              prism_binary):
    """A long-lived pool starts a worker per job: their semi-persistent directory is the pool's
    `workers/`, which `down` removes with the last pool."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    pool = own_pool(env_for(leak_key, TMPDIR=str(temp)))
    flags = ["--profile", "prism-pool", "--prism_location", prism_binary, "--environment_config", pool.address]
    side = Side("prism-pool", tmp_path / "side", sandbox_factory(key=leak_key, balance=1000.0), flags,
                pool.launcher_env(env_for(leak_key)), pool.logs, leak_key)
    outcome = side.cli("run", "--input", write_corpus(tmp_path / "corpus.parquet", corpus_rows()), "--output",
                       "{out}", "--model", "text-embedding-3-small", "--base-url", "{base_url}")
    assert outcome.code == 0, outcome.raw_stderr[-3000:]
    assert b"semi_persistent_directory" in pool.log.read_bytes()   # a worker booted
    assert list(temp.iterdir()) == [] and (pool.state / "workers").is_dir()
    pool.stop()
    assert not (pool.state / "workers").exists()


def test_make_clean_removes_prisms_build_and_the_pools_state_once_no_pool_runs(tmp_path):
    """On a copy of the tree's Makefile and tools/: a pool recorded in .pool runs on the .venv
    that `make clean` removes, so clean refuses and removes nothing; after pool-down it removes
    .cache/prism and .pool with the rest."""
    tree = tmp_path / "tree"
    shutil.copytree(pools.ROOT / "tools", tree / "tools", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(pools.ROOT / "Makefile", tree)
    made = [tree / ".venv" / "bin", tree / ".cache" / "prism" / "v0", tree / ".pool"]
    for path in made:
        path.mkdir(parents=True, exist_ok=True)
    clean = lambda: subprocess.run(["make", "-s", "clean", f"PYTHON={sys.executable}"], cwd=tree, capture_output=True,
                                   text=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if k not in ("POOL_DIR", "POOL_PORT")}
    pools.start(free_port(), tree / ".pool", env)
    try:
        refused = clean()
        assert refused.returncode != 0 and "stop it first with make pool-down" in refused.stderr, refused.stderr
        assert all(path.exists() for path in made)
    finally:
        pools.down(tree / ".pool")
    done = clean()
    assert done.returncode == 0, done.stderr
    assert not any(path.exists() for path in made)

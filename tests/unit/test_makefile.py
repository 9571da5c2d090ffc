"""The Makefile's stamps, on a copy of it (make -n: what each target would run): `make lint`
installs the lint extra once, and again only when setup.py changes, as `make setup` does."""
from __future__ import annotations

import os
import shutil
import subprocess

from tests.side_venv import REPO

INSTALL_LINT = "pip install -q -e '.[lint]'"


def _would_run(tree, target: str) -> str:
    done = subprocess.run(["make", "-n", target], cwd=tree, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _touch(path, at: float) -> None:
    path.touch()
    os.utime(path, (at, at))


def test_make_lint_installs_the_lint_extra_again_only_when_setup_py_changes(tmp_path):
    shutil.copy(REPO / "Makefile", tmp_path)
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    _touch(tmp_path / "setup.py", 1000)
    _touch(tmp_path / ".venv" / ".installed-stamp", 2000)
    assert INSTALL_LINT in _would_run(tmp_path, "lint")            # the first time
    _touch(tmp_path / ".venv" / ".lint-stamp", 3000)
    assert INSTALL_LINT not in _would_run(tmp_path, "lint")        # installed: only the checks
    _touch(tmp_path / "setup.py", 4000)
    assert INSTALL_LINT in _would_run(tmp_path, "lint")            # setup.py changed

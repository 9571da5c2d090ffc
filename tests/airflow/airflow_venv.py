"""Build (or reuse) the separate Airflow virtualenv the DAG test runs in.

Airflow cannot share the project venv (its pins fight Beam's), so it gets its own under
.venv-airflow/, reused while the hash of requirements.txt is unchanged. pip's output goes
to .venv-airflow/install.log.

    python tests/airflow/airflow_venv.py      # builds if needed, prints the venv's python
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
REQUIREMENTS = HERE / "requirements.txt"
VENV = Path(os.environ.get("AIRFLOW_TEST_VENV", REPO / ".venv-airflow"))
PIP_TIMEOUT_S = 1800


def requirements_hash() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]


def venv_python() -> Path:
    return VENV / "bin" / "python"


def _stamp() -> Path:
    return VENV / ".requirements-sha256"


def is_ready() -> bool:
    return _stamp().is_file() and _stamp().read_text().strip() == requirements_hash()


def ensure_venv(log=sys.stderr) -> Path:
    """Return the venv's python, building the venv first unless its stamp matches."""
    if is_ready():
        return venv_python()
    if VENV.exists():
        if not (VENV / "pyvenv.cfg").is_file():
            raise RuntimeError(f"{VENV} exists and is not a virtualenv: not touching it")
        shutil.rmtree(VENV)
    # The base interpreter, not the project venv's, so nothing of .venv leaks in.
    base = getattr(sys, "_base_executable", sys.executable)
    started = time.monotonic()
    subprocess.run([base, "-m", "venv", str(VENV)], check=True, timeout=120)
    pip = [str(venv_python()), "-m", "pip", "install", "-q"]
    with open(VENV / "install.log", "w") as out:
        for args in (["--upgrade", "pip"], ["-r", str(REQUIREMENTS)]):
            done = subprocess.run([*pip, *args], stdout=out, stderr=subprocess.STDOUT,
                                  timeout=PIP_TIMEOUT_S)
            if done.returncode:
                raise RuntimeError(f"pip install {' '.join(args)} failed: see {out.name}")
    _stamp().write_text(requirements_hash() + "\n")
    print(f"built {VENV} in {time.monotonic() - started:.0f} s ({_size_mb(VENV)} MB)", file=log)
    return venv_python()


def _size_mb(root: Path) -> int:
    files = (f for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    return sum(f.stat().st_size for f in files) >> 20


if __name__ == "__main__":
    print(ensure_venv())

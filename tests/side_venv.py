"""Separate virtualenvs for tests whose dependencies cannot or should not live in .venv
(Airflow's pins fight Beam's; chdb alone is ~530 MB). Each is reused while the hash of its
requirements file is unchanged; pip's output goes to <venv>/install.log."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PIP_TIMEOUT_S = 1800


class SideVenv:
    def __init__(self, venv: Path, requirements: Path):
        self.venv, self.requirements = Path(venv), Path(requirements)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def requirements_hash(self) -> str:
        return hashlib.sha256(self.requirements.read_bytes()).hexdigest()[:16]

    def _stamp(self) -> Path:
        return self.venv / ".requirements-sha256"

    def is_ready(self) -> bool:
        return self._stamp().is_file() and self._stamp().read_text().strip() == self.requirements_hash()

    def ensure(self, log=sys.stderr) -> Path:
        """Return the venv's python, building the venv first unless its stamp matches."""
        if self.is_ready():
            return self.python
        if self.venv.exists():
            if not (self.venv / "pyvenv.cfg").is_file():
                raise RuntimeError(f"{self.venv} exists and is not a virtualenv: not touching it")
            shutil.rmtree(self.venv)
        # The base interpreter, not the project venv's, so nothing of .venv leaks in.
        base = getattr(sys, "_base_executable", sys.executable)
        started = time.monotonic()
        subprocess.run([base, "-m", "venv", str(self.venv)], check=True, timeout=120)
        pip = [str(self.python), "-m", "pip", "install", "-q"]
        with open(self.venv / "install.log", "w") as out:
            for args in (["--upgrade", "pip"], ["-r", str(self.requirements)]):
                done = subprocess.run([*pip, *args], stdout=out, stderr=subprocess.STDOUT,
                                      timeout=PIP_TIMEOUT_S)
                if done.returncode:
                    raise RuntimeError(f"pip install {' '.join(args)} failed: see {out.name}")
        self._stamp().write_text(self.requirements_hash() + "\n")
        print(f"built {self.venv} in {time.monotonic() - started:.0f} s ({size_mb(self.venv)} MB)", file=log)
        return self.python


def size_mb(root: Path) -> int:
    files = (f for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    return sum(f.stat().st_size for f in files) >> 20

"""Separate virtualenvs for tests whose dependencies cannot or should not live in .venv
(Airflow's pins fight Beam's; chdb alone is ~530 MB). Each holds exactly a lock file at the
repository's root (tools/lock.py), installed by .venv's uv as make setup installs .venv, and is
reused while the hash of that lock is unchanged; uv's output goes to <venv>/install.log."""
from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INSTALL_TIMEOUT_S = 1800


class SideVenv:
    def __init__(self, venv: Path, lock: Path):
        self.venv, self.lock = Path(venv), Path(lock)

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def lock_hash(self) -> str:
        return hashlib.sha256(self.lock.read_bytes()).hexdigest()[:16]

    def _stamp(self) -> Path:
        return self.venv / ".lock-sha256"

    def is_ready(self) -> bool:
        return self._stamp().is_file() and self._stamp().read_text().strip() == self.lock_hash()

    def ensure(self, log=sys.stderr) -> Path:
        """Return the venv's python, building the venv first unless its stamp matches."""
        from tools.lock import differences, installed, read_lock, uv
        if self.is_ready():
            return self.python
        if self.venv.exists():
            if not (self.venv / "pyvenv.cfg").is_file():
                raise RuntimeError(f"{self.venv} exists and is not a virtualenv: not touching it")
            shutil.rmtree(self.venv)
        # The base interpreter, not the project venv's, so nothing of .venv leaks in.
        base = getattr(sys, "_base_executable", sys.executable)
        started = time.monotonic()
        made = subprocess.run([uv(), "--no-config", "venv", "--quiet", "--python", base, str(self.venv)],
                              capture_output=True, text=True, timeout=120)
        if made.returncode:
            raise RuntimeError(f"uv venv {self.venv} failed: {made.stderr.strip()}")
        with open(self.venv / "install.log", "w") as out:
            done = subprocess.run([uv(), "--no-config", "pip", "sync", "--python", str(self.python), "--require-hashes",
                                   "--no-build", "--compile-bytecode", str(self.lock)], stdout=out, stderr=subprocess.STDOUT,
                                  timeout=INSTALL_TIMEOUT_S)
        if done.returncode:
            raise RuntimeError(f"uv pip sync {self.lock.name} failed: see {self.venv / 'install.log'}")
        wrong = differences(read_lock(self.lock), installed(self.python))
        if wrong:
            raise RuntimeError(f"{self.venv} is not {self.lock.name}: " + "; ".join(wrong))
        self._stamp().write_text(self.lock_hash() + "\n")
        print(f"built {self.venv} from {self.lock.name} in {time.monotonic() - started:.0f} s "
              f"({size_mb(self.venv)} MB)", file=log)
        return self.python


def size_mb(root: Path) -> int:
    files = (f for f in root.rglob("*") if f.is_file() and not f.is_symlink())
    return sum(f.stat().st_size for f in files) >> 20

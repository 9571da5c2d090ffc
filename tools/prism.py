"""Beam's Prism runner for the installed apache-beam, built from the Go module proxy.

`make prism` (`python -m tools.prism install`) runs `go install
github.com/apache/beam/sdks/v2/go/cmd/prism@v<apache-beam version>` with every Go directory
(GOPATH, module and build caches) under `.cache/prism/` in the tree, so the build needs nothing
outside it and `make clean` (or `rm -rf .cache/prism`) removes all of it. The binary lands in
`.cache/prism/v<version>/prism` (where `--runner PrismRunner` looks: pipeline/prism.py): a
binary of another Beam version is never taken for this one, and one already there is not built
again (~2.5-4 min and 66 MB the first time on 2 cores). The build goes to a directory of its
own and is renamed into place, so a build stopped halfway leaves no binary that looks finished;
Go's caches (1.5 GB) are removed after it.

`python -m tools.prism path` prints the binary's path (exit 1 when it is not installed).
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
from importlib import metadata
from pathlib import Path

if __name__ == "__main__":   # `make prism` alone: Beam warns at import about GCP libraries this does not use
    logging.getLogger().setLevel(logging.ERROR)
from pipeline.prism import CACHE as PRISM_CACHE
from pipeline.prism import build_path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / PRISM_CACHE
PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"


def beam_version() -> str:
    return metadata.version("apache-beam")


def binary(version: str | None = None) -> Path:
    return Path(build_path(str(ROOT), version or beam_version()))


def _go_env(gobin: Path) -> dict[str, str]:
    go = CACHE / "go"
    # -modcacherw: Go makes its module cache read-only, which `rm -rf .cache/prism` could not remove
    return {**os.environ, "GOPATH": str(go), "GOMODCACHE": str(go / "pkg" / "mod"), "GOCACHE": str(go / "build"),
            "GOBIN": str(gobin), "GOFLAGS": "-modcacherw", "CGO_ENABLED": "0"}


def install() -> Path:
    """The binary for the installed apache-beam, built first when missing."""
    version = beam_version()
    target = binary(version)
    if target.is_file():
        return target
    if shutil.which("go") is None:
        raise SystemExit("make prism: Go is not installed (https://go.dev/doc/install); or put a Prism binary of "
                         f"Beam {version} at {target}")
    target.parent.mkdir(parents=True, exist_ok=True)
    print(f"building Prism v{version} from the Go module proxy into {target.parent} (a few minutes the first "
          "time)...", file=sys.stderr, flush=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as gobin:
        done = subprocess.run(["go", "install", f"{PACKAGE}@v{version}"], env=_go_env(Path(gobin)), cwd=CACHE,
                              capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"make prism: go install {PACKAGE}@v{version} failed:\n{done.stderr.strip()}")
        os.replace(Path(gobin) / "prism", target)
    shutil.rmtree(CACHE / "go", ignore_errors=True)
    return target


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "install"
    if command == "install":
        print(install())
        return 0
    if command == "path":
        target = binary()
        if not target.is_file():
            print(f"Prism v{beam_version()} is not installed: run make prism", file=sys.stderr)
            return 1
        print(target)
        return 0
    print("usage: python -m tools.prism [install | path]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

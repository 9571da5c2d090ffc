"""Beam's Prism runner for the installed apache-beam, built from the Go module proxy, bound to
loopback.

`make prism` (`python -m tools.prism install`) downloads the module github.com/apache/beam/sdks/v2
at the installed apache-beam's version (`go mod download`: the Go toolchain checks it against
sum.golang.org, and every dependency the build fetches against the module's go.sum), applies
tools/prism-bind.patch to a copy of its Go source (Prism's `-job_host`, default 127.0.0.1: its
header says what it changes) and builds go/cmd/prism. Every Go directory (GOPATH, module and
build caches) is under `.cache/prism/` in the tree, so the build needs nothing outside it and
`make clean` (or `rm -rf .cache/prism`) removes all of it. The binary lands in
`.cache/prism/v<version>/prism` (where `--runner PrismRunner` looks: pipeline/prism.py), beside a
copy of the patch it was built with: a binary of another Beam version or another patch is never
taken for this one, and one already there is not built again (~2.5-4 min and 66 MB the first
time on 2 cores). The build goes to a directory of its own and is renamed into place, so a
build stopped halfway leaves no binary that looks finished; Go's caches (1.5 GB) are removed
after it.

A version the patch does not fit fails in one line naming the file: a hunk that does not apply,
or a listener in Prism's source that is not one of LISTENERS (which the patch binds).

`python -m tools.prism path` prints the binary's path (exit 1 when it is not installed).
"""
from __future__ import annotations

import json
import logging
import os
import re
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
MODULE = "github.com/apache/beam/sdks/v2"
PACKAGE = "./go/cmd/prism"
PATCH = ROOT / "tools" / "prism-bind.patch"
SOURCES = ("go/cmd/prism", "go/pkg/beam/runners/prism")   # Prism's own Go code, in the module
LISTENERS = {   # every place Prism's source listens, as the patch leaves it: both take -job_host
    ("go/pkg/beam/runners/prism/internal/jobservices/server.go",
     'lis, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))'),
    ("go/pkg/beam/runners/prism/internal/web/web.go", "go http.ListenAndServe(endpoint, mux)"),
}
_LISTEN = re.compile(r"\.Listen\w*\(")


def beam_version() -> str:
    return metadata.version("apache-beam")


def binary(version: str | None = None) -> Path:
    return Path(build_path(str(ROOT), version or beam_version()))


def _record(target: Path) -> Path:
    """The copy of the patch TARGET was built with."""
    return target.with_name("prism.patch")


def installed(target: Path) -> bool:
    """Whether TARGET is a build with tools/prism-bind.patch as it is."""
    record = _record(target)
    return target.is_file() and record.is_file() and record.read_bytes() == PATCH.read_bytes()


def _go_env() -> dict[str, str]:
    go = CACHE / "go"
    # -modcacherw: Go makes its module cache read-only, which `rm -rf .cache/prism` could not remove.
    # The environment exempts no module from the checksum database (Beam's own module has no
    # go.sum to be checked against: only sum.golang.org, or the GOSUMDB mirror it names, vouches for it).
    sumdb = os.environ.get("GOSUMDB", "")
    return {**os.environ, "GOPATH": str(go), "GOMODCACHE": str(go / "pkg" / "mod"), "GOCACHE": str(go / "build"),
            "GOFLAGS": "-modcacherw -mod=readonly -buildvcs=false", "CGO_ENABLED": "0", "GOWORK": "off",
            "GOSUMDB": "" if sumdb == "off" else sumdb, "GONOSUMDB": "", "GOPRIVATE": "", "GOINSECURE": ""}


def _last_line(text: str) -> str:
    return next((line for line in reversed(text.strip().splitlines()) if line.strip()), "no output")


def _source(version: str, src: Path) -> None:
    """The module's go.mod, go.sum and Go source at VERSION, copied into SRC (the module cache
    stays as Go verified it)."""
    done = subprocess.run(["go", "mod", "download", "-json", f"{MODULE}@v{version}"], env=_go_env(), cwd=CACHE,
                          capture_output=True, text=True)
    try:
        found = json.loads(done.stdout)
    except ValueError:
        found = {}
    if done.returncode or "Dir" not in found:
        raise SystemExit(f"make prism: go mod download {MODULE}@v{version} failed: "
                         f"{found.get('Error') or _last_line(done.stderr)}")
    module = Path(found["Dir"])
    src.mkdir()
    for name in ("go.mod", "go.sum"):
        shutil.copyfile(module / name, src / name)
    shutil.copytree(module / "go", src / "go")


def _apply(src: Path, version: str) -> None:
    """The patch on SRC, exactly (git apply takes no fuzz), or a SystemExit naming the file."""
    if shutil.which("git") is None:
        raise SystemExit(f"make prism: git is not installed (it applies {os.path.relpath(PATCH, ROOT)})")
    # not the checkout's repository: git apply in a repository's subdirectory skips paths outside it
    done = subprocess.run(["git", "apply", "--whitespace=nowarn", str(PATCH)], cwd=src, capture_output=True,
                          text=True, env={**os.environ, "GIT_CEILING_DIRECTORIES": str(src.parent)})
    if done.returncode:
        where = re.search(r"error: (?:patch failed: )?([^:\s]+)", done.stderr)
        raise SystemExit(f"make prism: {os.path.relpath(PATCH, ROOT)} does not apply to Prism of Beam {version} "
                         f"({where.group(1) if where else _last_line(done.stderr)}): update it for that version's "
                         "source")


def listeners(src: Path) -> set[tuple[str, str]]:
    """(file, line) of each call in Prism's Go source under SRC that opens a listener."""
    found = set()
    for top in SOURCES:
        for path in sorted((src / top).rglob("*.go")):
            if path.name.endswith("_test.go"):
                continue
            for line in path.read_text(encoding="utf-8").splitlines():
                if _LISTEN.search(line) and not line.lstrip().startswith("//"):
                    found.add((path.relative_to(src).as_posix(), line.strip()))
    return found


def _check_listeners(src: Path, version: str) -> None:
    if unknown := sorted(listeners(src) ^ LISTENERS):
        file, line = unknown[0]
        raise SystemExit(f"make prism: Prism of Beam {version} listens where {os.path.relpath(PATCH, ROOT)} does not "
                         f"bind it ({file}: {line}): update the patch and tools/prism.py's LISTENERS")


def install() -> Path:
    """The binary for the installed apache-beam, built first when missing or built with another patch."""
    version = beam_version()
    target = binary(version)
    if installed(target):
        return target
    if shutil.which("go") is None:
        raise SystemExit("make prism: Go is not installed (https://go.dev/doc/install); or pass --prism_location "
                         "PATH to a Prism binary of your own")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    _record(target).unlink(missing_ok=True)
    print(f"building Prism v{version} from the Go module proxy with {os.path.relpath(PATCH, ROOT)} into {target.parent} "
          "(a few minutes)...", file=sys.stderr, flush=True)
    try:
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as build:
            src, built = Path(build) / "src", Path(build) / "prism"
            _source(version, src)
            _apply(src, version)
            _check_listeners(src, version)
            done = subprocess.run(["go", "build", "-trimpath", "-o", str(built), PACKAGE], env=_go_env(), cwd=src,
                                  capture_output=True, text=True)
            if done.returncode:
                raise SystemExit(f"make prism: go build {PACKAGE} of Beam {version} failed:\n{done.stderr.strip()}")
            shutil.copyfile(PATCH, _record(target))
            os.replace(built, target)
    finally:
        shutil.rmtree(CACHE / "go", ignore_errors=True)
    return target


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "install"
    if command == "install":
        print(install())
        return 0
    if command == "path":
        target = binary()
        if not installed(target):
            print(f"Prism v{beam_version()} with {os.path.relpath(PATCH, ROOT)} is not installed: run make prism",
                  file=sys.stderr)
            return 1
        print(target)
        return 0
    print("usage: python -m tools.prism [install | path]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

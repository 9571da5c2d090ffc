"""The lock files at the repository's root: every package of each environment the Makefile makes,
at one version, with the sha256 of every file of that version on the index.

    python -m tools.lock [--platform P]    `make lock`: the newest versions within the ranges, every lock rewritten
    python -m tools.lock check LOCK        this interpreter's distributions (`pip list`) against LOCK, and
                                           LOCK against setup.py (make setup and make lint run it)

| lock                      | installed by                      | resolved from                                        |
|---------------------------|-----------------------------------|------------------------------------------------------|
| requirements.lock         | make setup (.venv)                | setup.py's test and postgres extras, tools/venv.in   |
| requirements-uv.lock      | make setup, first (pip, hashed)   | uv at requirements.lock's version                    |
| requirements-dev.lock     | make lint, make bench (.venv)     | the above and the lint, bench and report extras      |
| requirements-interop.lock | make interop (.venv-interop)      | tests/interop/requirements.in                        |
| requirements-airflow.lock | make airflow-test (.venv-airflow) | tests/airflow/requirements.in                        |

The dev and interop locks are resolved with requirements.lock as constraints: what they share
with it is at its versions. uv's `pip compile` resolves for CPython 3.11 on x86_64 Linux with
glibc 2.28 or newer (PLATFORM; another one with --platform, for that machine only); the same
index state gives the same files. A failed resolution leaves every lock as it was.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"
PROJECT = "embedpipe"


@dataclasses.dataclass(frozen=True)
class Lock:
    path: str
    sources: tuple[str, ...]
    extras: tuple[str, ...] = ()          # setup.py's, when it is a source
    constraints: str | None = None        # a lock this one agrees with
    stdin: str | None = None              # requirements given on stdin (source "-")


BASE = Lock("requirements.lock", ("setup.py", "tools/venv.in"), ("test", "postgres"))
UV = Lock("requirements-uv.lock", ("-",), constraints=BASE.path, stdin="uv\n")
DEV = Lock("requirements-dev.lock", BASE.sources, (*BASE.extras, "lint", "bench", "report"), BASE.path)
INTEROP = Lock("requirements-interop.lock", ("tests/interop/requirements.in",), constraints=BASE.path)
AIRFLOW = Lock("requirements-airflow.lock", ("tests/airflow/requirements.in",))
LOCKS = (BASE, UV, DEV, INTEROP, AIRFLOW)   # in this order: the constraints come first


def uv() -> str:
    from uv import find_uv_bin   # the uv of requirements-uv.lock, in .venv
    return find_uv_bin()


def compile_command(lock: Lock, platform: str) -> list[str]:
    # --no-config: a user's uv.toml changes nothing; the header names `make lock`, not this
    # machine's paths, so that two runs on one index state write the same bytes
    command = [uv(), "--no-config", "pip", "compile", *lock.sources, "--output-file", lock.path,
               "--upgrade", "--generate-hashes", "--python-version", PYTHON_VERSION, "--python-platform", platform,
               "--custom-compile-command", "make lock", "--no-progress", "--quiet"]
    for extra in lock.extras:
        command += ["--extra", extra]
    if lock.constraints:
        command += ["--constraints", lock.constraints]
    return command


def write_locks(platform: str) -> None:
    before = {lock.path: (ROOT / lock.path).read_bytes() if (ROOT / lock.path).exists() else None for lock in LOCKS}
    try:
        for lock in LOCKS:
            done = subprocess.run(compile_command(lock, platform), cwd=ROOT, input=lock.stdin, text=True,
                                  capture_output=True)
            if done.returncode:
                raise SystemExit(f"make lock: {lock.path} not resolved; every lock left as it was:\n"
                                 f"{done.stderr.strip()}")
            print(f"{lock.path}: {len(read_lock(ROOT / lock.path))} packages", file=sys.stderr)
    except BaseException:
        for path, content in before.items():
            if content is None:
                (ROOT / path).unlink(missing_ok=True)
            else:
                (ROOT / path).write_bytes(content)
        raise
    print(f"apache-beam {read_lock(ROOT / BASE.path)['apache-beam']}", file=sys.stderr)


PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(path: Path) -> dict[str, str]:
    """{canonical name: version} of a lock's pins."""
    pins = (PIN.match(line) for line in path.read_text().splitlines())
    return {canonical(m[1]): m[2] for m in pins if m}


def installed(python: str | Path) -> dict[str, str]:
    """What `pip list` shows for PYTHON's environment, the editable project left out."""
    done = subprocess.run([uv(), "--no-config", "pip", "list", "--python", str(python), "--format", "json",
                           "--exclude-editable"], capture_output=True, text=True, check=True)
    return {canonical(d["name"]): d["version"] for d in json.loads(done.stdout)}


def differences(locked: dict[str, str], found: dict[str, str]) -> list[str]:
    """Each way FOUND (installed) is not exactly LOCKED, one line each."""
    from packaging.version import Version
    lines = []
    for name in sorted(locked.keys() | found.keys()):
        want, have = locked.get(name), found.get(name)
        if have is None:
            lines.append(f"{name}=={want} is not installed")
        elif want is None:
            lines.append(f"{name} {have} is installed and not in the lock")
        elif Version(have) != Version(want):
            lines.append(f"{name} {have} is installed, the lock has {want}")
    return lines


def unmet(locked: dict[str, str], extras: tuple[str, ...], project: str = PROJECT) -> list[str]:
    """The requirements of PROJECT[EXTRAS] (setup.py as installed here), followed through the
    requirements and extras of each dependency installed here, that LOCKED does not satisfy:
    a lock older than setup.py."""
    from importlib import metadata

    from packaging.requirements import Requirement
    lines, followed = [], set()
    todo = [(project, extra) for extra in ("", *extras)]
    while todo:
        name, extra = todo.pop()
        if (name, extra) in followed:
            continue
        followed.add((name, extra))
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:   # locked, not installed here: its own requirements unseen
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is not None and not req.marker.evaluate({"extra": extra}):
                continue
            dep, version = canonical(req.name), locked.get(canonical(req.name))
            if version is None:
                lines.append(f"{name} requires {req}, which the lock lacks")
            elif not req.specifier.contains(version, prereleases=True):
                lines.append(f"{name} requires {req}, the lock has {version}")
            else:
                todo += [(dep, wanted) for wanted in ("", *req.extras)]
    return sorted(set(lines))


def check(path: str) -> int:
    lock = next((lock for lock in LOCKS if lock.path == path), None)
    if lock is None:
        print(f"{path} is not one of {', '.join(lock.path for lock in LOCKS)}", file=sys.stderr)
        return 2
    locked = read_lock(ROOT / lock.path)
    wrong = differences(locked, installed(sys.executable))
    if wrong:
        print(f"{sys.prefix} is not {lock.path}:\n  " + "\n  ".join(wrong), file=sys.stderr)
        return 1
    stale = unmet(locked, lock.extras) if "setup.py" in lock.sources else []
    if stale:
        print(f"{lock.path} is older than setup.py: run `make lock`\n  " + "\n  ".join(stale), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", nargs="?", choices=["write", "check"], default="write")
    parser.add_argument("lock", nargs="?", help="check: the lock to compare this interpreter with")
    parser.add_argument("--platform", default=PLATFORM, help=f"uv's --python-platform (default {PLATFORM})")
    args = parser.parse_args(argv)
    if args.command == "check":
        if not args.lock:
            parser.error("check needs a LOCK")
        return check(args.lock)
    write_locks(args.platform)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

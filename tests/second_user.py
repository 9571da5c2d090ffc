"""A second local user for the security tests: what another account on the same machine can reach
(the embedded server's socket, a worker pool's port, DIR's files). Made once by `useradd` when the
tests run as root (our CI does); tests that need it are skipped otherwise. Commands run as that user
are argument lists started with its uid and gids: no shell reads a path."""
from __future__ import annotations

import os
import pwd
import subprocess

import pytest

NAME = "embedpipe-other"


def second_user() -> pwd.struct_passwd:
    """The second user, made on first use; the calling test is skipped unless we are root."""
    if os.geteuid() != 0:
        pytest.skip("needs root to act as a second local user")
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                               NAME], capture_output=True, text=True)
        if done.returncode not in (0, 9):   # 9: made meanwhile by another test process
            raise RuntimeError(f"useradd {NAME}: {done.stderr.strip()}") from None
        return pwd.getpwnam(NAME)


def run_as_second_user(argv: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """ARGV run as the second user (its uid, its own group only), output captured as text."""
    user = second_user()
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("timeout", 60)
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8"}
    return subprocess.run(argv, user=user.pw_uid, group=user.pw_gid, extra_groups=[], env=env,
                          text=True, cwd="/", **kwargs)

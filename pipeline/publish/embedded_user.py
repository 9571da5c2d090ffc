"""Who the embedded PostgreSQL runs as. PostgreSQL never runs as root: a command run by a user
runs its server as that user; one run by root, as the owner of the data directory (DIR/_postgres,
whose owner PostgreSQL requires), for a new one as DIR's owner, and where root owns DIR as a
system user of its own, SYSTEM_USER (no login shell, no home, a group of its own; made by
useradd on first use). Run by root, the server's processes have that user's uid and group only:
no supplementary group, never group root. The mode of no directory is changed for it: where it
cannot pass a directory on the way to its data or its binaries, one line names that directory."""
from __future__ import annotations

import dataclasses
import os
import pwd
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

from pipeline.exits import JobFailed, UsageError

SYSTEM_USER = "embedpipe-postgres"
def as_root() -> bool:
    return os.geteuid() == 0


@dataclasses.dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int

    def spawn(self) -> dict[str, Any]:
        """subprocess's arguments that start a program as this account: its uid and group only.
        Nothing when it is the caller's own."""
        if not as_root():
            return {}
        return {"user": self.uid, "group": self.gid, "extra_groups": []}

    def own(self, target: Path | int) -> None:
        """TARGET (a path, never followed if a link, or a descriptor), made by root for the
        server, given to its user (who reads, replaces or appends to it when it runs the
        commands itself)."""
        if not as_root():
            return
        if isinstance(target, int):
            os.fchown(target, self.uid, self.gid)
        else:
            os.chown(target, self.uid, self.gid, follow_symlinks=False)


def _account(entry: pwd.struct_passwd) -> Account:
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _owner(path: Path) -> pwd.struct_passwd | None:
    """PATH's owner, unless root or a uid without a name (peer authentication maps names)."""
    uid = path.stat().st_uid
    if uid == 0:
        return None
    try:
        return pwd.getpwuid(uid)
    except KeyError:
        return None


def system_user() -> Account:
    """SYSTEM_USER, made on first use (only root can)."""
    try:
        return _account(pwd.getpwnam(SYSTEM_USER))
    except KeyError:
        pass
    shell = next((s for s in ("/usr/sbin/nologin", "/sbin/nologin") if Path(s).exists()), "/bin/false")
    try:
        done = subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                               "--shell", shell, SYSTEM_USER], capture_output=True, text=True)
    except FileNotFoundError:
        raise JobFailed(f"the embedded PostgreSQL runs as a system user of its own, {SYSTEM_USER}, and useradd, "
                        f"which makes it, is not installed here: make the user (no login, a group of its own), "
                        f"or publish to a postgresql:// URL") from None
    if done.returncode not in (0, 9):   # 9: made meanwhile by another command
        raise JobFailed(f"useradd {SYSTEM_USER} (the embedded PostgreSQL's own user) failed: "
                        f"{done.stderr.strip() or done.returncode}")
    return _account(pwd.getpwnam(SYSTEM_USER))


def account_for(data: Path) -> Account:
    """The user that runs the server of DATA (see the module's text)."""
    made = (data / "PG_VERSION").exists()
    if not as_root():
        if made and (uid := data.stat().st_uid) != os.geteuid():
            raise UsageError(f"{data} belongs to {_name(uid)}, and its server runs as the owner of its data: "
                             f"run the command as {_name(uid)}, or as root")
        return _account(pwd.getpwuid(os.geteuid()))
    if made:
        if data.stat().st_uid == 0:
            user = _owner(data.parent) or pwd.getpwnam(system_user().name)
            raise UsageError(f"{data} belongs to root, and PostgreSQL never runs as root: give it to the user its "
                             f"server runs as: {shlex.join(['chown', '-R', f'{user.pw_name}:', str(data)])}")
        if owner := _owner(data):
            return _account(owner)
    if owner := _owner(data.parent):
        return _account(owner)
    return system_user()


def _passes(account: Account, path: Path) -> bool:
    """ACCOUNT can pass PATH (search permission, as the kernel decides it: modes, ACLs): asked of
    test(1) run as ACCOUNT (no interpreter of ours need be reachable by it), with no environment:
    ACCOUNT may read its process's, and ours holds the API key."""
    test = shutil.which("test") or "test"
    return subprocess.run([test, "-x", str(path)], cwd="/", env={}, **account.spawn()).returncode == 0


def _first_blocked(account: Account, path: Path) -> Path | None:
    if _passes(account, path):
        return None
    return next((p for p in reversed(path.parents) if not _passes(account, p)), path)


def check_reach(account: Account, data: Path, binaries: Path) -> None:
    """A one-line refusal (exit 2) when ACCOUNT cannot reach DATA's directory or run BINARIES:
    the directory that stops it is named; nothing is changed for it."""
    if not as_root() or shutil.which("test") is None:   # without test(1), the server's own error says it
        return
    for path, what, elsewhere in ((data.parent, str(data), "keep DIR"),
                                  (binaries / "postgres", f"the PostgreSQL it runs ({binaries})", "install the project")):
        if (blocked := _first_blocked(account, path)) is None:
            continue
        mode = oct(blocked.stat().st_mode & 0o777)[2:]
        raise UsageError(f"the embedded PostgreSQL runs as {account.name} (PostgreSQL never runs as root), which "
                         f"cannot pass {blocked} (mode {mode}) to reach {what}: {elsewhere} where {account.name} can "
                         f"reach it, let it pass ({shlex.join(['chmod', 'o+x', str(blocked)])}), or publish to a "
                         "postgresql:// URL")

"""Files in the embedded server's directories, which its user owns, touched by us, possibly root:
through the directory's descriptor, never through a link, and a file appended to only when it
is a plain one of its own (no other name, so no other file's). Whoever runs the server (or a
program it runs) cannot turn root's writes there into writes elsewhere."""
from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

from pipeline.publish.embedded_user import Account

_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC
NOT_PLAIN = "not a plain file of its own (a link, or a file with another name too)"


def open_dir(path: Path) -> int:
    """PATH's descriptor; an OSError when it is a link or no directory."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW)


def open_plain(directory: int, name: str, flags: int, account: Account | None = None) -> int:
    """NAME in DIRECTORY opened with FLAGS, when it is a plain file that no other name shares;
    ACCOUNT's (it may be made: O_CREAT)."""
    try:
        fd = os.open(name, flags | os.O_NONBLOCK | _NOFOLLOW, 0o600, dir_fd=directory)
    except OSError as exc:
        if exc.errno == errno.ELOOP:   # a link
            raise OSError(errno.EPERM, NOT_PLAIN, name) from None
        raise
    found = os.fstat(fd)
    if not stat.S_ISREG(found.st_mode) or found.st_nlink != 1:
        os.close(fd)
        raise OSError(errno.EPERM, NOT_PLAIN, name)
    if account is not None:
        account.own(fd)
    return fd


def read(directory: int, name: str) -> str:
    fd = open_plain(directory, name, os.O_RDONLY)
    with os.fdopen(fd, encoding="utf-8", errors="replace") as f:
        return f.read()


def read_path(path: Path) -> str:
    """PATH's text, unless PATH (its last part) is a link or no plain file: OSError."""
    directory = open_dir(path.parent)
    try:
        return read(directory, path.name)
    finally:
        os.close(directory)


def write(directory: int, name: str, text: str, account: Account) -> None:
    """NAME in DIRECTORY holding TEXT, whole (a reader sees the old file or the new), ACCOUNT's."""
    temp = f".{name}.{uuid.uuid4().hex[:12]}"
    try:
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o600, dir_fd=directory)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            account.own(f.fileno())
            f.write(text)
        os.replace(temp, name, src_dir_fd=directory, dst_dir_fd=directory)
    except OSError:
        try:
            os.unlink(temp, dir_fd=directory)
        except FileNotFoundError:
            pass
        raise


def ensure_line(directory: int, name: str, line: str) -> None:
    """NAME in DIRECTORY ending with LINE unless it holds it already."""
    fd = open_plain(directory, name, os.O_RDWR | os.O_APPEND)
    with os.fdopen(fd, "r+", encoding="utf-8") as f:
        if line not in f.read().splitlines():
            f.write(f"\n{line}\n")


def remove_socket_dir(path: Path, account: Account, prefix: str, parent: Path) -> None:
    """PATH, a private socket directory of ACCOUNT's (named PREFIX... in PARENT), emptied of
    PostgreSQL's socket and lock files and removed; anything else is left alone."""
    try:
        found = os.lstat(path)
    except OSError:
        return
    if (path.parent != parent or not path.name.startswith(prefix) or not stat.S_ISDIR(found.st_mode)
            or found.st_uid != account.uid):
        return
    try:
        directory = open_dir(path)
    except OSError:
        return
    try:
        for name in os.listdir(directory):
            if name.startswith(".s.PGSQL."):
                os.unlink(name, dir_fd=directory)
    except OSError:
        pass
    finally:
        os.close(directory)
    try:
        os.rmdir(path)
    except OSError:
        pass

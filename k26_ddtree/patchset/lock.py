"""One patch-set command at a time per site: an exclusive flock on <site>/.k26-ddtree.lock.

flock is released by the kernel when its holder dies, however it dies, so a lock is never
stale. The file is left in place afterwards: deleting a lock file races with a process that
has just opened it. While held it names its holder ("pid N (apply)") for the message a second
command prints while it waits; it is emptied on release.
"""

from __future__ import annotations

import errno
import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from k26_ddtree.errors import UserError

LOCK_NAME = ".k26-ddtree.lock"
DEFAULT_TIMEOUT_S = 30.0
BUSY_EXIT = 75  # sysexits EX_TEMPFAIL: another command has the site; retrying later is the fix
_POLL_S = 0.1


def _open(path: Path, read_only_ok: bool) -> tuple[int, bool] | None:
    """(fd, writable), or None when a read-only command finds no lock file and cannot create one."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644), True
    except OSError as err:
        if not (read_only_ok and err.errno in (errno.EACCES, errno.EPERM, errno.EROFS)):
            raise UserError(f"cannot open the lock file {path} ({err.strerror}); nothing changed") from None
    try:
        # flock needs no write access, so a reader still queues behind a writer that has the file.
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC), False
    except FileNotFoundError:
        return None  # nobody could ever have locked here with a lock file this user cannot create


def _holder(fd: int) -> str:
    text = os.pread(fd, 200, 0).decode("utf-8", "replace").strip()
    return text or "another k26-deploy apply"


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


@contextmanager
def held(site: Path, command: str, timeout: float, out: Callable[[str], None],
         read_only: bool = False) -> Iterator[None]:
    """Hold the site's lock for the block, waiting up to `timeout` seconds (0: refuse at once)."""
    path = site / LOCK_NAME
    opened = _open(path, read_only)
    if opened is None:
        out(f"not locking: {path} does not exist and cannot be created here; reading unlocked")
        yield
        return
    fd, writable = opened
    try:
        if not _try(fd):
            holder = _holder(fd)
            if timeout <= 0:
                raise UserError(f"the lock on {site} is held by {holder}; nothing done (--lock-timeout 0)", code=BUSY_EXIT)
            out(f"waiting for the lock on {site} held by {holder}, up to {timeout:g} s")
            deadline = time.monotonic() + timeout
            while not _try(fd):
                if time.monotonic() >= deadline:
                    raise UserError(f"the lock on {site} is still held by {_holder(fd)} after {timeout:g} s; "
                                    "nothing done (retry, or give a longer --lock-timeout)", code=BUSY_EXIT)
                time.sleep(_POLL_S)
        if writable:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} ({command})\n".encode(), 0)
        try:
            yield
        finally:
            if writable:
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)

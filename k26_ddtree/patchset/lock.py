"""One writing patch-set command at a time per site: a flock on <site>/.k26-ddtree.lock.

apply and --revert hold it exclusively, creating the file if need be; --check and --dry-run
create nothing (they promise to change nothing), so they hold it shared, and only when the
file is already there: session.reading says how they stay correct when it is not.

flock is released by the kernel when its holder dies, however it dies, so a lock is never
stale. The file is left in place afterwards: deleting a lock file races with a process that
has just opened it (and session.reading relies on it staying). While a writer holds it, it
names itself ("pid N (apply)") for the message a second command prints while it waits; it is
emptied on release.
"""

from __future__ import annotations

import fcntl
import os
import re
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from k26_ddtree.errors import UserError
from k26_ddtree.processes import alive

LOCK_NAME = ".k26-ddtree.lock"
DEFAULT_TIMEOUT_S = 30.0
MAX_TIMEOUT_S = 3600.0  # an hour: past that a waiting command is a hung deploy, not patience
BUSY_EXIT = 75  # sysexits EX_TEMPFAIL: another command has the site; retrying later is the fix
UNNAMED = "another process (not a k26-deploy apply we can name)"
_POLL_S = 0.1
# What a writer below puts in the file; nine digits at most keeps os.kill's argument in range.
_HOLDER = re.compile(r"pid ([1-9][0-9]{0,8}) \((apply|apply --revert)\)\n")

Out = Callable[[str], None]


def path(site: Path) -> Path:
    return site / LOCK_NAME


def exists(site: Path) -> bool:
    return os.path.lexists(path(site))


def _holder(fd: int) -> str:
    """The holder, named only from what a live writer wrote: a reader, a plain `flock`, or the
    leftover text of a writer killed by SIGKILL would otherwise be misnamed (or, for a file
    anyone wrote, flood the message)."""
    match = _HOLDER.fullmatch(os.pread(fd, 200, 0).decode("ascii", "replace"))
    if match is None or not alive(int(match.group(1))):
        return UNNAMED
    return f"pid {match.group(1)} ({match.group(2)})"


def _try(fd: int, operation: int) -> bool:
    try:
        fcntl.flock(fd, operation | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _wait(fd: int, operation: int, site: Path, timeout: float, out: Out) -> None:
    """Take the flock, waiting up to `timeout` seconds (0: refuse at once)."""
    if _try(fd, operation):
        return
    holder = _holder(fd)
    if timeout <= 0:
        raise UserError(f"the lock on {site} is held by {holder}; nothing done (--lock-timeout 0)", code=BUSY_EXIT)
    out(f"waiting for the lock on {site} held by {holder}, up to {timeout:g} s")
    deadline = time.monotonic() + timeout
    while not _try(fd, operation):
        if time.monotonic() >= deadline:
            raise UserError(f"the lock on {site} is still held by {_holder(fd)} after {timeout:g} s; "
                            "nothing done (retry, or give a longer --lock-timeout)", code=BUSY_EXIT)
        time.sleep(_POLL_S)


@contextmanager
def held(site: Path, command: str, timeout: float, out: Out) -> Iterator[None]:
    """Hold the site's lock exclusively for the block (a writing command), creating the file."""
    try:
        fd = os.open(path(site), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as err:
        raise UserError(f"cannot open the lock file {path(site)} ({err.strerror}); nothing changed") from None
    try:
        _wait(fd, fcntl.LOCK_EX, site, timeout, out)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} ({command})\n".encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
    finally:
        os.close(fd)


@contextmanager
def shared(site: Path, timeout: float, out: Out) -> Iterator[bool]:
    """Hold the site's lock shared for the block (a reading command) if the lock file exists;
    whether it is held. Nothing is created or written."""
    try:
        # flock needs no write access, so a reader queues behind a writer even on a read-only site.
        fd = os.open(path(site), os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        yield False
        return
    except OSError as err:
        raise UserError(f"cannot open the lock file {path(site)} ({err.strerror}); nothing done") from None
    try:
        _wait(fd, fcntl.LOCK_SH, site, timeout, out)
        yield True
    finally:
        os.close(fd)

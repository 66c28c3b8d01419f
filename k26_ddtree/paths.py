"""The rules for every file a command reads or writes as its input or its result.

A file read is a regular file, read up to a cap: a path naming /dev/zero, a FIFO or a
multi-gigabyte file by mistake would otherwise be read until memory runs out, or block forever.
A result is written to a regular file whose folder exists, through a symlink to the file it
names (as a results file that is appended to must be), never over a device, a folder or one of
the command's own inputs: a typo must not replace /dev/null, the trace or the costs.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from k26_ddtree.errors import UserError

MB = 1 << 20


def _size(n: int) -> str:
    return f"{n / MB:g} MB"


def open_input(path: Path, what: str, max_bytes: int):
    """A binary handle on the regular file at `path`, at most max_bytes long; UserError naming
    `what` otherwise. FileNotFoundError passes through: whether a missing file is an error is the
    caller's to say. Opened without blocking, so a FIFO is refused rather than waited on."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise UserError(f"{what} cannot be read ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(f"{what} is not a regular file ({_kind(info.st_mode)})")
        if info.st_size > max_bytes:
            raise UserError(f"{what} is {_size(info.st_size)}, more than the {_size(max_bytes)} read at most")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_input(path: Path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file at `path` (open_input's rules); a file that grows past the
    cap while it is read is refused too."""
    with open_input(path, what, max_bytes) as handle:
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise UserError(f"{what} grew past the {_size(max_bytes)} read at most while it was read")
    return data


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def output_target(path: Path, flag: str, inputs: tuple[Path, ...] = ()) -> Path:
    """The file a result given as `flag PATH` is written to: through symlinks, the file they name.
    UserError when that is a symlink loop, its folder does not exist, it exists as anything but a
    regular file, or it is one of `inputs` (the files the command reads)."""
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops at a link it cannot follow: a loop
        raise UserError(f"{flag} {path} is a symlink loop")
    if not target.parent.is_dir():
        raise UserError(f"{flag} {path}: the folder {target.parent} does not exist (create it first)")
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as err:
        raise UserError(f"{flag} {path} cannot be written ({err.strerror or err})") from None
    if info is not None and not stat.S_ISREG(info.st_mode):
        raise UserError(f"{flag} {path} is {_kind(info.st_mode)}; give the path of a file to write")
    for source in inputs:
        if _same_file(target, Path(source)):
            raise UserError(f"{flag} {path} is {source}, which this command reads; give another path")
    return target


def distinct_outputs(targets: dict[str, Path]) -> None:
    """UserError when two results (flag: resolved target) would be written to the same file."""
    seen: dict[Path, str] = {}
    for flag, target in targets.items():
        if target in seen:
            raise UserError(f"{seen[target]} and {flag} name the same file {target}; give two paths")
        seen[target] = flag


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return os.path.realpath(a) == os.path.realpath(b)

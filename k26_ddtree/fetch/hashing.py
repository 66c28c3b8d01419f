"""File digests: SHA-256 always, the git blob id when the hub gave only that."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

_CHUNK = 8 << 20


@dataclass(frozen=True)
class Digests:
    size: int
    sha256: str
    git_oid: str | None


def file_digests(path: Path, with_git_oid: bool = False,
                 on_bytes: Callable[[int], None] | None = None) -> Digests:
    """Hash `path` in one pass; `on_bytes(n)` is called after each chunk (for progress)."""
    sha256 = hashlib.sha256()
    size = path.stat().st_size
    git = None
    if with_git_oid:
        git = hashlib.sha1()  # git's object id, not a security choice: the hub lists it
        git.update(b"blob %d\0" % size)
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    read_total = 0
    with open(path, "rb") as handle:
        while True:
            n = handle.readinto(buffer)
            if not n:
                break
            sha256.update(view[:n])
            if git is not None:
                git.update(view[:n])
            read_total += n
            if on_bytes is not None:
                on_bytes(n)
    if git is not None and read_total != size:
        git = None  # the file changed while hashing; the size check will report it
    return Digests(size=read_total, sha256=sha256.hexdigest(),
                   git_oid=git.hexdigest() if git is not None else None)

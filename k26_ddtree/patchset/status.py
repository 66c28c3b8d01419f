"""What state an SGLang installation is in with respect to a patch set, file by file."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.patchset.locate import Installation
from k26_ddtree.hashing import sha256_bytes
from k26_ddtree.patchset.pins import FilePin, PatchSet

PRISTINE = "pristine"
APPLIED = "applied"
FOREIGN = "foreign-modified"
PARTIAL = "partially-applied"
WRONG_VERSION = "wrong-version"
INTERRUPTED = "interrupted"  # a journal is left: a command was killed mid-transaction

# `apply --check` exit codes: 0 healthy, 1 `apply` would fix it, 2 `apply` refuses (needs a person).
CHECK_EXIT = {APPLIED: 0, PRISTINE: 1, PARTIAL: 1, INTERRUPTED: 1, FOREIGN: 2, WRONG_VERSION: 2}


@dataclass(frozen=True)
class FileStatus:
    pin: FilePin
    path: Path
    current: bytes | None  # None: the file does not exist
    state: str             # PRISTINE, APPLIED or FOREIGN
    obstacle: str | None = None  # why apply cannot replace it as a regular file (a symlink, a folder, ...)

    @property
    def describe(self) -> str:
        if self.obstacle is not None:
            return self.obstacle
        if self.state != FOREIGN:
            return self.state
        if self.current is None:
            return f"{FOREIGN} (missing)"
        return f"{FOREIGN} (SHA256 {sha256_bytes(self.current)[:16]}..., neither the original nor the patched file)"


@dataclass(frozen=True)
class Status:
    installation: Installation
    patch_set: PatchSet
    files: tuple[FileStatus, ...]

    @property
    def version_ok(self) -> bool:
        return self.installation.version == self.patch_set.sglang_version

    @property
    def state(self) -> str:
        if not self.version_ok:
            return WRONG_VERSION
        states = {f.state for f in self.files}
        if FOREIGN in states:
            return FOREIGN
        if states == {APPLIED}:
            return APPLIED
        if states == {PRISTINE}:
            return PRISTINE
        return PARTIAL

    def with_state(self, state: str) -> list[FileStatus]:
        return [f for f in self.files if f.state == state]


def _file_state(pin: FilePin, current: bytes | None) -> str:
    digest = sha256_bytes(current) if current is not None else None
    if digest is not None and digest == pin.patched_sha256:
        return APPLIED
    if digest == pin.original_sha256:  # both None: a file the patch adds, not there yet
        return PRISTINE
    return FOREIGN


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISREG, "a regular file"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a device"), (stat.S_ISBLK, "a device")):
        if test(mode):
            return name
    return "an unknown kind of file"


def _obstacle(site: Path, rel: str) -> str | None:
    """Why the path cannot be read and replaced as a regular file, or None: it is one, or it is
    absent (a file the patch adds), folders on the way included."""
    path = site
    parts = rel.split("/")
    for depth, part in enumerate(parts, 1):
        path = path / part
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return None
        if stat.S_ISLNK(mode):
            # Patching through a link would write outside this site (a shared store, another
            # environment) where neither the lock nor the journal reach, and replacing the link
            # would detach it silently; so a linked target is refused, by name.
            return (f"{path.name} is a symlink to {os.readlink(path)}; apply replaces regular files only: "
                    "put a copy of the file or folder in place of the link")
        if depth < len(parts) and not stat.S_ISDIR(mode):
            return f"{FOREIGN} ({'/'.join(parts[:depth])} is {_kind(mode)} where a folder belongs)"
        if depth == len(parts) and not stat.S_ISREG(mode):
            # Reading it would fail or block (a FIFO), and os.replace cannot put a file over a folder.
            return f"{FOREIGN} ({_kind(mode)} where a file belongs)"
    return None


def inspect(installation: Installation, patch_set: PatchSet) -> Status:
    files = []
    for pin in patch_set.files:
        path = installation.site / pin.rel
        obstacle = _obstacle(installation.site, pin.rel)
        current = path.read_bytes() if obstacle is None and path.is_file() else None
        state = FOREIGN if obstacle is not None else _file_state(pin, current)
        files.append(FileStatus(pin, path, current, state, obstacle))
    return Status(installation, patch_set, tuple(files))

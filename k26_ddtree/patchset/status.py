"""What state an SGLang installation is in with respect to a patch set, file by file."""

from __future__ import annotations

import os
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
    link: Path | None = None  # the symlink on the way to the file (itself or a folder above it)

    @property
    def describe(self) -> str:
        if self.link is not None:
            return (f"{self.link.name} is a symlink to {os.readlink(self.link)}; apply replaces regular files only: "
                    "put a copy of the file or folder in place of the link")
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


def _symlink_on_the_way(site: Path, rel: str) -> Path | None:
    # Patching through a link would write outside this site (a shared store, another
    # environment) where neither the lock nor the journal reach, and replacing the link
    # would detach it silently; so a linked target is refused, by name.
    path = site
    for part in rel.split("/"):
        path = path / part
        if path.is_symlink():
            return path
    return None


def inspect(installation: Installation, patch_set: PatchSet) -> Status:
    files = []
    for pin in patch_set.files:
        path = installation.site / pin.rel
        link = _symlink_on_the_way(installation.site, pin.rel)
        current = path.read_bytes() if path.is_file() else None
        state = FOREIGN if link is not None else _file_state(pin, current)
        files.append(FileStatus(pin, path, current, state, link))
    return Status(installation, patch_set, tuple(files))

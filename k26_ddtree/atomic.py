"""Whole-or-nothing file writes: a temp file in the target's folder, fsync, then os.replace.

Every record this toolkit writes (units, last-good copies, manifests, model hash files,
benchmark results, the patch set's staged and backed-up SGLang files) goes through here, so an interrupted or failed write never leaves half a
file where a reader expects a whole one.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from k26_ddtree.errors import UserError


_NEW_FILE_MODE = 0o644
TMP_SUFFIX = ".k26-tmp"  # every staged file is .<name>.<random>.k26-tmp, so leftovers can be found


def stage(path: Path, data: bytes, mode: int | None = None) -> Path:
    """A temp file beside `path` holding `data`, flushed to disk, with `mode` (default:
    `path`'s permissions if it exists, else 0644). Raises OSError; nothing is left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if mode is None:
        mode = stat.S_IMODE(path.stat().st_mode) if path.exists() else _NEW_FILE_MODE
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=TMP_SUFFIX)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(name, mode)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    return Path(name)


def replace(path: Path, data: bytes, mode: int | None = None) -> None:
    """Put `data` at `path` whole (stage, then os.replace). Raises OSError."""
    tmp = stage(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def fsync_dir(path: Path) -> None:
    """Make the entries of folder `path` (files replaced, added or removed there) survive power loss."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_bytes(path: Path, data: bytes, mode: int | None = None) -> None:
    """replace(), with a failure reported as a UserError naming the file."""
    try:
        replace(path, data, mode)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror or err}") from None


def write_text(path: Path, text: str, mode: int | None = None) -> None:
    write_bytes(path, text.encode("utf-8"), mode)


def refresh_text(path: Path, text: str) -> str:
    """Write a generated file only when its text changed; "PATH: rewritten" or "PATH: unchanged"."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return f"{path}: unchanged"
    write_text(path, text)
    return f"{path}: rewritten"

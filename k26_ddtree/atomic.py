"""Whole-or-nothing file writes: a temp file in the target's folder, fsync, then os.replace.

Every record this toolkit writes (units, last-good copies, manifests, model hash files,
benchmark results) goes through here, so an interrupted or failed write never leaves half a
file where a reader expects a whole one.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from k26_ddtree.errors import UserError


def write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as err:
        raise UserError(f"cannot write {path}: {err.strerror}") from None
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_text(path: Path, text: str, mode: int = 0o644) -> None:
    write_bytes(path, text.encode("utf-8"), mode)

"""Replace a set of files all or nothing: stage beside each target, verify, os.replace, roll back on failure."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_file


@dataclass(frozen=True)
class Change:
    path: Path
    old: bytes | None   # the content now (None: absent), restored on rollback
    new: bytes | None   # the content wanted (None: remove the file)
    new_sha256: str | None


def _drop_bytecode(path: Path) -> None:
    # Timestamp pycs are keyed on mtime and size; a restored file can match both, so drop them.
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def replace_all(changes: list[Change], progress: Callable[[str], None], label: Callable[[Path], str]) -> None:
    """Carry out every change or none of them.

    Every new content is staged and re-read (its SHA256 checked) before the
    first target is touched; os.replace then swaps each in. If a swap fails,
    the ones already swapped are put back from the bytes held in memory.
    """
    staged: dict[Path, Path] = {}
    done: list[Change] = []
    try:
        for change in changes:
            if change.new is None:
                continue
            try:
                tmp = atomic.stage(change.path, change.new)
            except OSError as err:
                raise UserError(f"could not stage {label(change.path)} ({err}); nothing changed", code=1) from None
            staged[change.path] = tmp
            if sha256_file(tmp) != change.new_sha256:
                raise UserError(f"staged copy of {label(change.path)} does not hash as pinned (disk problem?); nothing changed", code=1)
        progress(f"staged and verified {len(staged)} file(s); replacing")
        try:
            for change in changes:
                if change.new is None:
                    change.path.unlink(missing_ok=True)
                else:
                    os.replace(staged[change.path], change.path)
                    del staged[change.path]
                done.append(change)
                _drop_bytecode(change.path)
                progress(f"  {'removed' if change.new is None else 'replaced'} {label(change.path)}")
        except BaseException as err:
            failed = _roll_back(done)
            where = label(changes[len(done)].path) if len(done) < len(changes) else "the end"
            if failed:
                raise UserError(
                    f"replacing failed at {where} ({err}); could NOT restore: {', '.join(label(p) for p in failed)}", code=1
                ) from None
            raise UserError(f"replacing failed at {where} ({err}); rolled back {len(done)} file(s), nothing changed", code=1) from None
    finally:
        for tmp in staged.values():
            tmp.unlink(missing_ok=True)


def _roll_back(done: list[Change]) -> list[Path]:
    failed = []
    for change in reversed(done):
        try:
            if change.old is None:
                change.path.unlink(missing_ok=True)
            else:
                atomic.replace(change.path, change.old)
            _drop_bytecode(change.path)
        except OSError:
            failed.append(change.path)
    return failed

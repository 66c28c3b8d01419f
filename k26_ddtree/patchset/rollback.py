"""Undo a transaction from its journal, or finish the clean-up of one that committed: used by
transaction.py when a step fails or a signal comes, and by recovery.py after a kill.

Every action is checked against what is on disk first, so a rollback that is itself cut
short (another kill, power loss) can simply be run again from the same journal.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from k26_ddtree.hashing import sha256_file, tree_digest
from k26_ddtree.patchset import journal as journals
from k26_ddtree.patchset.journal import DirEntry, Journal


def sha_of(path: Path) -> str | None:
    return sha256_file(path) if path.is_file() else None


def drop_bytecode(path: Path) -> None:
    # Timestamp pycs are keyed on mtime and size; a restored file can match both, so drop them.
    cache = path.parent / "__pycache__"
    if path.suffix == ".py" and cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def remove_path(path: Path) -> None:
    """Delete a file or a whole folder; one already gone counts as deleted."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def reason(err: BaseException) -> str:
    if isinstance(err, OSError):
        return err.strerror or str(err) or type(err).__name__
    return str(err) or type(err).__name__


def roll_back(site: Path, journal: Journal) -> list[str]:
    """Put every path the journal names back as it was before, and delete the journal; what could
    not be put back (then the journal stays, for the next command to retry)."""
    problems = []
    for entry in reversed(journal.files):
        path = site / entry.path
        try:
            current = sha_of(path)
            if current == entry.old_sha256:
                continue
            if current != entry.new_sha256:
                problems.append(f"{entry.path} (neither its old nor its new content; left as it is)")
                continue
            if entry.old_sha256 is None:
                path.unlink()
            elif entry.undo is None or sha_of(site / entry.undo) != entry.old_sha256:
                problems.append(f"{entry.path} (its undo copy is missing or damaged)")
                continue
            else:
                os.replace(site / entry.undo, path)
            drop_bytecode(path)
        except OSError as err:
            problems.append(f"{entry.path} ({reason(err)})")
    if journal.directory and journal.directory.scratch:
        try:
            _undo_copy(site, journal.directory)
        except OSError as err:
            problems.append(f"{journal.directory.path} ({reason(err)})")
    if problems:
        return problems
    problems = finish(site, journal, rolling_back=True) + _differences(site, journal)
    return problems or _remove_journal(site)


def _undo_copy(site: Path, entry: DirEntry) -> None:
    path, scratch = site / entry.path, site / entry.scratch
    old = scratch / "old"
    if path.exists() and (old.exists() or not entry.existed):
        os.rename(path, scratch / "undone")
    if old.exists():
        os.rename(old, path)


def finish(site: Path, journal: Journal, rolling_back: bool = False) -> list[str]:
    """Delete the staged and undo copies and the scratch folder, then the journal; the leftovers
    that could not be deleted. Rolling back, the folders the transaction made go too, and the
    journal stays until the caller has checked every path."""
    left = []
    leftovers = [site / p for e in journal.files for p in (e.staged, e.undo) if p]
    if journal.directory and journal.directory.scratch:
        leftovers.append(site / journal.directory.scratch)
    for path in leftovers:
        try:
            remove_path(path)
        except OSError as err:
            left.append(f"{path.relative_to(site).as_posix()} ({reason(err)})")
    for folder in reversed(journal.made_dirs if rolling_back else []):
        try:
            (site / folder).rmdir()
        except FileNotFoundError:
            pass
        except OSError as err:
            left.append(f"{folder} ({reason(err)})")
    if not left and not rolling_back:
        left = _remove_journal(site)
    return left


def _remove_journal(site: Path) -> list[str]:
    try:
        journals.remove(site)
    except OSError as err:
        return [f"{journals.path(site)} ({reason(err)})"]
    return []


def _differences(site: Path, journal: Journal) -> list[str]:
    """Every path the journal names that is not as it was before the transaction, by SHA256."""
    differ = [e.path for e in journal.files if sha_of(site / e.path) != e.old_sha256]
    differ += [f"{p} (left over)" for e in journal.files for p in (e.staged, e.undo) if p and (site / p).exists()]
    if journal.directory:
        entry = journal.directory
        if tree_digest(site / entry.path) != entry.old_digest:
            differ.append(entry.path)
        if entry.scratch and (site / entry.scratch).exists():
            differ.append(f"{entry.scratch} (left over)")
    differ += [f"{folder} (left over)" for folder in journal.made_dirs if (site / folder).exists()]
    return differ

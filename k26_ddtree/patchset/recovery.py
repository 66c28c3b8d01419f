"""What a killed command left in the site, found at the start of the next one (under the lock).

A journal in phase preparing or replacing is rolled back: its undo copies make that always
possible without the patch set or the backups, it is the same code that undoes a failure or
a signal in-process, and the command then starts from a whole state. A journal in phase
committed had only its clean-up left, so that is finished. Staged files (`.*.k26-tmp`) with no
journal (an interrupted older k26-deploy, or a kill between commit and clean-up) are deleted.
apply and --revert do this; --check and --dry-run only report it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

from k26_ddtree.atomic import TMP_SUFFIX
from k26_ddtree.errors import UserError
from k26_ddtree.patchset import journal as journals
from k26_ddtree.patchset.journal import COMMITTED, Journal
from k26_ddtree.patchset.rollback import finish, remove_path, roll_back

Out = Callable[[str], None]


def _names(site: Path, paths: list[Path]) -> str:
    return ", ".join(p.relative_to(site).as_posix() for p in paths)


def report(site: Path, folders: Iterable[Path], out: Out) -> tuple[Journal | None, list[Path]]:
    """Say what recovery would do, changing nothing; (the journal, the stray staged files)."""
    journal = journals.read(site)
    if journal is not None and journal.phase == COMMITTED:
        out(f"interrupted {journal.describe()} found: {journals.path(site)}; its change is complete, "
            "`k26-deploy apply` or `k26-deploy apply --revert` finishes the clean-up")
    elif journal is not None:
        out(f"interrupted {journal.describe()} found: {journals.path(site)}; run `k26-deploy apply` or "
            "`k26-deploy apply --revert` to finish it (either first rolls it back)")
    left = _unrecorded(site, journal, folders)
    if left:
        out(f"stray staged file(s) from an interrupted run: {_names(site, left)} "
            "(`k26-deploy apply` or `k26-deploy apply --revert` deletes them)")
    return journal, left


def _unrecorded(site: Path, journal: Journal | None, folders: Iterable[Path]) -> list[Path]:
    """Staged files and scratch folders (`.*.k26-tmp`) beside any path a transaction stages at,
    less those the journal names (its undo copies above all are the rollback's to use)."""
    where = {site, *folders}
    named: set[Path] = set()
    if journal is not None:
        where |= {(site / e.path).parent for e in journal.files} | {site / d for d in journal.made_dirs}
        named = {site / p for e in journal.files for p in (e.staged, e.undo) if p}
        if journal.directory and journal.directory.scratch:
            named.add(site / journal.directory.scratch)
    found = {p for folder in where if folder.is_dir() for p in folder.iterdir()
             if p.name.startswith(".") and p.name.endswith(TMP_SUFFIX)}
    return sorted(found - named)


def _delete(paths: list[Path]) -> None:
    for path in paths:
        try:
            remove_path(path)
        except OSError as err:
            raise UserError(f"cannot delete the stray staged file {path} ({err.strerror}); "
                            "stopped before changing anything else", code=1) from None


def recover(site: Path, folders: Iterable[Path], out: Out) -> bool:
    """Undo (or finish) an interrupted transaction, delete stray staged files; whether anything was found."""
    # The caller holds the lock, which a journal's writer held for its whole transaction: so
    # that writer is gone, and its journal is no live command's.
    journal = journals.read(site)
    # Strays go first: they may sit in a folder the rollback removes.
    left = _unrecorded(site, journal, folders)
    _delete(left)
    if journal is None:
        if left:
            out(f"deleted {len(left)} stray staged file(s) left by an interrupted run: {_names(site, left)}")
        return bool(left)
    found = f"found an interrupted {journal.describe()} ({journals.path(site)})"
    if journal.phase == COMMITTED:
        problems = finish(site, journal)
        done = "its change was complete: finished its clean-up"
    else:
        problems = roll_back(site, journal)
        done = "rolled it back; every path it touched hashes as before it"
    if problems:
        raise UserError(f"{found} and could not undo it: {', '.join(problems)}; "
                        "run the command again, or put these back by hand and delete the journal", code=1)
    unrecorded = f" (and deleted {len(left)} staged file(s) it had not recorded yet)" if left else ""
    out(f"{found}: {done}{unrecorded}")
    return True

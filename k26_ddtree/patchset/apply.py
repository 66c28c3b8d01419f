"""`k26-deploy apply`: patch, check and revert an SGLang installation against the pinned patch set.

Apply writes each patched file as the pinned original on disk with its diff
applied exactly, checked against its patched SHA256 before anything is staged
(pins.PatchSet.patched_bytes); revert puts the originals back from the backups,
or runs the diffs backwards when a backup is gone.

Backups of the originals go to <site>/.k26-ddtree-backup/sglang-<version>/<rel>
(the tree beside the `sglang` package, out of the way of imports); revert
prefers them and removes them once the originals are back.

apply and revert hold the site lock (lock.py) and first recover what a killed
command left (recovery.py); check and the dry runs only read (session.reading),
creating nothing, not even the lock file. apply and revert are each one
transaction (transaction.py) over the sglang files, the backups and the
k26_ddtree import, so they change all of it or none of it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes
from k26_ddtree.patchset import importable, recovery, transaction
from k26_ddtree.patchset.journal import Journal
from k26_ddtree.patchset.lock import DEFAULT_TIMEOUT_S
from k26_ddtree.patchset.locate import Installation, locate
from k26_ddtree.patchset.pins import PatchSet, load, root_for
from k26_ddtree.patchset.session import reading, session
from k26_ddtree.patchset.status import (APPLIED, CHECK_EXIT, FOREIGN, INTERRUPTED, PARTIAL, PRISTINE, WRONG_VERSION,
                                        FileStatus, Status, inspect)
from k26_ddtree.patchset.transaction import FileStep, Step
from k26_ddtree.patchset.udiff import PatchError, apply_diff

BACKUP_DIR = ".k26-ddtree-backup"

Out = Callable[[str], None]


def backup_root(installation: Installation) -> Path:
    return installation.site / BACKUP_DIR / f"sglang-{installation.version}"


def _staging_folders(installation: Installation, patch_set: PatchSet) -> set[Path]:
    """Where a transaction stages files: beside each target and inside the backup tree."""
    folders = {(installation.site / pin.rel).parent for pin in patch_set.files}
    backups = installation.site / BACKUP_DIR
    if backups.is_dir():
        folders |= {backups} | {p for p in backups.rglob("*") if p.is_dir()}
    return folders


def _recovery(installation: Installation, patch_set: PatchSet, out: Out) -> Callable[[], bool]:
    return lambda: recovery.recover(installation.site, _staging_folders(installation, patch_set), out)


def _describe(status: Status, out: Out) -> None:
    inst = status.installation
    out(f"sglang {inst.version} at {inst.package} (version from {inst.version_source})")
    out(f"patch set {status.patch_set.root} (for sglang {status.patch_set.sglang_version}, {len(status.files)} file(s))")
    for number, file in enumerate(status.files, 1):
        out(f"  [{number}/{len(status.files)}] {file.pin.rel}: {file.describe}")


def _refuse_unless_patchable(status: Status, doing: str) -> None:
    if status.state == WRONG_VERSION:
        raise UserError(f"refusing to {doing}: sglang at {status.installation.package} is "
                        f"{status.installation.version}, the patch set is for {status.patch_set.sglang_version}; nothing changed")
    foreign = status.with_state(FOREIGN)
    if foreign:
        names = ", ".join(f"{f.pin.rel} ({f.describe})" for f in foreign)
        raise UserError(f"refusing to {doing}: {names}; nothing changed")


def _backup_steps(status: Status, files: list[FileStatus]) -> list[Step]:
    """Backups of the originals about to be patched, unless a good one is already there."""
    found: list[Step] = []
    for file in files:
        if file.current is None:
            continue  # a file the patch adds has no original
        backup = backup_root(status.installation) / file.pin.rel
        old = backup.read_bytes() if backup.is_file() else None
        if old is None or sha256_bytes(old) != file.pin.original_sha256:
            found.append(FileStep(backup, "backup", old, file.current))
    return found


def _target(sglang_dir: str | Path | None, root: Path | None) -> tuple[Installation, PatchSet]:
    """The installation and its patch set. A named patch set is checked whole before anything is
    read from the site; without one, the installed version picks the shipped patch set."""
    if root is not None:
        patch_set = load(root)
        return locate(sglang_dir), patch_set
    installation = locate(sglang_dir)
    return installation, load(root_for(installation.version))


def apply(sglang_dir: str | Path | None = None, root: Path | None = None, dry_run: bool = False,
          out: Out = print, lock_timeout: float = DEFAULT_TIMEOUT_S) -> int:
    installation, patch_set = _target(sglang_dir, root)
    if dry_run:
        return reading(installation.site, "apply --dry-run", lock_timeout, out,
                       lambda say: _dry_run_apply(inspect(installation, patch_set), say))
    with session(installation.site, "apply", lock_timeout, out, _recovery(installation, patch_set, out)) as signals:
        status = inspect(installation, patch_set)
        _describe(status, out)
        _refuse_unless_patchable(status, "patch")
        todo = status.with_state(PRISTINE)
        import_plan = importable.plan(status.installation.site)
        out(f"k26_ddtree import: {import_plan.action}: {import_plan.reason}")
        steps = [*_backup_steps(status, todo), *importable.steps(import_plan),
                 *(FileStep(f.path, "sglang", f.current, patch_set.patched_bytes(f.pin, f.current)) for f in todo)]
        if todo:
            out(f"backups of the originals: {backup_root(status.installation)}")
        if steps:
            transaction.run(status.installation.site, "apply", steps, signals, out)
        if not todo:
            out("already applied")
            return 0
        out(f"applied: {len(todo)} file(s) patched" + (f", {len(status.files) - len(todo)} were already" if status.state == PARTIAL else ""))
        return 0


def _dry_run_apply(status: Status, out: Out) -> int:
    _describe(status, out)
    _note_recovery_first(status, out)
    _refuse_unless_patchable(status, "patch")
    todo = status.with_state(PRISTINE)
    import_plan = importable.plan(status.installation.site)
    for file in todo:
        status.patch_set.patched_bytes(file.pin, file.current)  # a diff that does not fit is refused here too
        out(f"dry run: would write {file.pin.rel} (SHA256 {file.pin.patched_sha256[:16]}...)")
    if todo:
        out(f"dry run: would keep the originals under {backup_root(status.installation)}")
    out(f"dry run: would patch {len(todo)} file(s), {len(status.files) - len(todo)} already applied")
    out(f"dry run: k26_ddtree import: {import_plan.action}: {import_plan.reason}")
    return 0


def _note_recovery_first(status: Status, out: Out) -> None:
    journal, strays = _report_pending(status, out)
    if journal is not None or strays:
        out("dry run: a real run deals with that first; this plan is for the tree as it is now")


def _report_pending(status: Status, out: Out) -> tuple[Journal | None, list[Path]]:
    """recovery.report for this install: (the journal of an interrupted transaction, the stray staged files)."""
    return recovery.report(status.installation.site, _staging_folders(status.installation, status.patch_set), out)


def _original_bytes(status: Status, file: FileStatus) -> bytes | None:
    """The original of an applied file: its backup, else the diff run backwards; None for an added file."""
    if file.pin.original_sha256 is None:
        return None
    backup = backup_root(status.installation) / file.pin.rel
    if backup.is_file():
        data = backup.read_bytes()
        if sha256_bytes(data) == file.pin.original_sha256:
            return data
    diff = status.patch_set.diff_bytes(file.pin)
    try:
        data = apply_diff(file.current, diff, reverse=True)
    except PatchError as err:
        raise UserError(f"cannot restore {file.pin.rel}: no good backup at {backup} and the diff does not reverse ({err}); nothing changed", code=1) from None
    if sha256_bytes(data) != file.pin.original_sha256:
        raise UserError(f"cannot restore {file.pin.rel}: no good backup at {backup} and the reversed diff does not hash as the original; nothing changed", code=1)
    return data


def _prune_backup_folders(installation: Installation) -> None:
    """Remove the backup tree's folders that revert emptied (the tree is ours alone)."""
    base = installation.site / BACKUP_DIR
    if not base.is_dir():
        return
    for directory in sorted((p for p in base.rglob("*") if p.is_dir()), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    if not any(base.iterdir()):
        base.rmdir()


def revert(sglang_dir: str | Path | None = None, root: Path | None = None, dry_run: bool = False,
           out: Out = print, lock_timeout: float = DEFAULT_TIMEOUT_S) -> int:
    installation, patch_set = _target(sglang_dir, root)
    if dry_run:
        return reading(installation.site, "apply --revert --dry-run", lock_timeout, out,
                       lambda say: _dry_run_revert(inspect(installation, patch_set), say))
    with session(installation.site, "apply --revert", lock_timeout, out,
                 _recovery(installation, patch_set, out)) as signals:
        status = inspect(installation, patch_set)
        _describe(status, out)
        _refuse_unless_patchable(status, "revert")
        todo = status.with_state(APPLIED)
        backups = [backup_root(installation) / pin.rel for pin in patch_set.files]
        steps = [*(FileStep(f.path, "sglang", f.current, _original_bytes(status, f)) for f in todo),
                 *importable.removal_steps(installation.site),
                 *(FileStep(b, "backup", b.read_bytes(), None) for b in backups if b.is_file())]
        if steps:
            transaction.run(installation.site, "revert", steps, signals, out)
        _prune_backup_folders(installation)
        out(f"reverted: {len(todo)} file(s) restored" if todo else "already pristine")
        return 0


def _dry_run_revert(status: Status, out: Out) -> int:
    _describe(status, out)
    _note_recovery_first(status, out)
    _refuse_unless_patchable(status, "revert")
    todo = status.with_state(APPLIED)
    for file in todo:
        how = "remove" if file.pin.original_sha256 is None else "restore"
        out(f"dry run: would {how} {file.pin.rel}")
    out(f"dry run: would restore {len(todo)} file(s), {len(status.files) - len(todo)} already pristine")
    return 0


def check(sglang_dir: str | Path | None = None, root: Path | None = None, out: Out = print,
          lock_timeout: float = DEFAULT_TIMEOUT_S) -> int:
    """Report the state, changing nothing; the exit code is CHECK_EXIT[state], except for an
    applied install whose Python lacks this k26_ddtree (1 when apply would add it, 2 when a
    different one is in the way) or that has stray staged files left (1: apply deletes them)."""
    installation, patch_set = _target(sglang_dir, root)
    return reading(installation.site, "apply --check", lock_timeout, out,
                   lambda say: _check(inspect(installation, patch_set), say))


def _check(status: Status, out: Out) -> int:
    _describe(status, out)
    journal, strays = _report_pending(status, out)
    if journal is not None:
        out(f"state: {INTERRUPTED}")
        return CHECK_EXIT[INTERRUPTED]
    return _check_state(status, bool(strays), out)


def _check_state(status: Status, strays: bool, out: Out) -> int:
    state = status.state
    if state == APPLIED:
        try:
            import_plan = importable.plan(status.installation.site)
        except UserError as err:
            out(f"k26_ddtree import: BLOCKED: {err}")
            out("state: applied, but sglang's Python imports a different k26_ddtree")
            return 2
        if import_plan.action != importable.NOTHING:
            out(f"k26_ddtree import: MISSING: apply would do {import_plan.action}: {import_plan.reason}")
            out("state: applied, but sglang's Python cannot import this k26_ddtree (run k26-deploy apply)")
            return 1
        out(f"k26_ddtree import: ok: {import_plan.reason}")
        if strays:
            out("state: applied, but stray staged files are left (run k26-deploy apply to delete them)")
            return 1
    if state == WRONG_VERSION:
        out(f"state: {state} (sglang {status.installation.version}, the patch set is for {status.patch_set.sglang_version})")
    else:
        out(f"state: {state}")
    return CHECK_EXIT[state]

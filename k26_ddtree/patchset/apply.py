"""`k26-deploy apply`: patch, check and revert an SGLang installation against the pinned patch set.

Apply writes the full patched files (exact bytes, each checked against its
pin); the diffs in the patch set are for review and for `patch -p1`, and let
revert rebuild an original when its backup is gone.

Backups of the originals go to <site>/.k26-ddtree-backup/sglang-<version>/<rel>
(the tree beside the `sglang` package, out of the way of imports); revert
prefers them and removes them once the originals are back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.patchset import importable
from k26_ddtree.patchset.locate import Installation, locate
from k26_ddtree.hashing import sha256_bytes, sha256_file
from k26_ddtree.patchset.pins import load
from k26_ddtree.patchset.status import (APPLIED, CHECK_EXIT, FOREIGN, PARTIAL, PRISTINE, WRONG_VERSION,
                                        FileStatus, Status, inspect)
from k26_ddtree.patchset.transaction import Change, replace_all
from k26_ddtree.patchset.udiff import PatchError, apply_diff

BACKUP_DIR = ".k26-ddtree-backup"

Out = Callable[[str], None]


def backup_root(installation: Installation) -> Path:
    return installation.site / BACKUP_DIR / f"sglang-{installation.version}"


def _label(site: Path) -> Callable[[Path], str]:
    return lambda path: path.relative_to(site).as_posix()


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


def _verify_installed(status: Status, want: str, out: Out) -> None:
    wrong = []
    for file in status.files:
        digest = sha256_file(file.path) if file.path.is_file() else None
        expected = file.pin.patched_sha256 if want == APPLIED else file.pin.original_sha256
        if digest != expected:
            wrong.append(file.pin.rel)
    if wrong:
        raise UserError(f"after replacing, these files do not hash as pinned: {', '.join(wrong)}", code=1)
    out(f"verified {len(status.files)}/{len(status.files)} files: {want}")


def _write_backups(status: Status, files: list[FileStatus], out: Out) -> None:
    root = backup_root(status.installation)
    for file in files:
        if file.current is None:
            continue  # a file the patch adds has no original
        backup = root / file.pin.rel
        if not (backup.is_file() and sha256_file(backup) == file.pin.original_sha256):
            try:
                atomic.replace(backup, file.current)
            except OSError as err:
                raise UserError(f"could not write the backup {backup} ({err}); nothing changed", code=1) from None
            if sha256_file(backup) != file.pin.original_sha256:
                raise UserError(f"backup {backup} does not hash as its original; nothing changed", code=1)
    out(f"backups of the originals: {root}")


def apply(sglang_dir: str | Path | None = None, root: Path | None = None,
          dry_run: bool = False, out: Out = print) -> int:
    patch_set = load(root)
    status = inspect(locate(sglang_dir), patch_set)
    _describe(status, out)
    _refuse_unless_patchable(status, "patch")
    todo = status.with_state(PRISTINE)
    changes = [Change(f.path, f.current, patch_set.patched_bytes(f.pin), f.pin.patched_sha256) for f in todo]
    import_plan = importable.plan(status.installation.site)
    if dry_run:
        for file in todo:
            out(f"dry run: would write {file.pin.rel} (SHA256 {file.pin.patched_sha256[:16]}...)")
        if todo:
            out(f"dry run: would keep the originals under {backup_root(status.installation)}")
        out(f"dry run: would patch {len(todo)} file(s), {len(status.files) - len(todo)} already applied")
        out(f"dry run: k26_ddtree import: {import_plan.action}: {import_plan.reason}")
        return 0
    try:
        importable.carry_out(import_plan)
    except OSError as err:
        raise UserError(f"could not make k26_ddtree importable ({import_plan.reason}): {err}; sglang unchanged", code=1) from None
    out(f"k26_ddtree import: {import_plan.action}: {import_plan.reason}")
    if not todo:
        out("already applied")
        return 0
    _write_backups(status, todo, out)
    replace_all(changes, out, _label(status.installation.site))
    _verify_installed(status, APPLIED, out)
    out(f"applied: {len(todo)} file(s) patched" + (f", {len(status.files) - len(todo)} were already" if status.state == PARTIAL else ""))
    return 0


def _original_bytes(status: Status, file: FileStatus) -> bytes | None:
    """The original of an applied file: its backup, else the diff run backwards; None for an added file."""
    if file.pin.original_sha256 is None:
        return None
    backup = backup_root(status.installation) / file.pin.rel
    if backup.is_file():
        data = backup.read_bytes()
        if sha256_bytes(data) == file.pin.original_sha256:
            return data
    try:
        data = apply_diff(file.current, status.patch_set.diff_file(file.pin.rel).read_bytes(), reverse=True)
    except (OSError, PatchError) as err:
        raise UserError(f"cannot restore {file.pin.rel}: no good backup at {backup} and the diff does not reverse ({err}); nothing changed", code=1) from None
    if sha256_bytes(data) != file.pin.original_sha256:
        raise UserError(f"cannot restore {file.pin.rel}: no good backup at {backup} and the reversed diff does not hash as the original; nothing changed", code=1)
    return data


def _drop_backups(installation: Installation, files: list[FileStatus]) -> None:
    root = backup_root(installation)
    for file in files:
        (root / file.pin.rel).unlink(missing_ok=True)
    for directory in sorted((p for p in root.rglob("*") if p.is_dir()), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    for directory in (root, root.parent):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()


def revert(sglang_dir: str | Path | None = None, root: Path | None = None,
           dry_run: bool = False, out: Out = print) -> int:
    patch_set = load(root)
    status = inspect(locate(sglang_dir), patch_set)
    _describe(status, out)
    _refuse_unless_patchable(status, "revert")
    todo = status.with_state(APPLIED)
    if dry_run:
        for file in todo:
            how = "remove" if file.pin.original_sha256 is None else "restore"
            out(f"dry run: would {how} {file.pin.rel}")
        out(f"dry run: would restore {len(todo)} file(s), {len(status.files) - len(todo)} already pristine")
        return 0
    if todo:
        changes = [Change(f.path, f.current, _original_bytes(status, f), f.pin.original_sha256) for f in todo]
        replace_all(changes, out, _label(status.installation.site))
        _verify_installed(status, PRISTINE, out)
        _drop_backups(status.installation, todo)
    for line in importable.undo(status.installation.site):
        out(line)
    out(f"reverted: {len(todo)} file(s) restored" if todo else "already pristine")
    return 0


def check(sglang_dir: str | Path | None = None, root: Path | None = None, out: Out = print) -> int:
    """Report the state; the exit code is CHECK_EXIT[state], except for an applied install whose
    Python lacks this k26_ddtree: 1 when apply would add it, 2 when a different one is in the way."""
    patch_set = load(root)
    status = inspect(locate(sglang_dir), patch_set)
    _describe(status, out)
    state = status.state
    code = CHECK_EXIT[state]
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
    if state == WRONG_VERSION:
        out(f"state: {state} (sglang {status.installation.version}, the patch set is for {patch_set.sglang_version})")
    else:
        out(f"state: {state}")
    return code

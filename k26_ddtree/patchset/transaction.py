"""Change a set of paths in the site all or nothing, journalled, so that a signal, a failure,
SIGKILL or power loss part-way leaves a tree that is rolled back to exactly what it was.

Steps are files (an sglang target, its backup, the .pth: write, replace or remove) and at most
one folder (the k26_ddtree copy beside sglang: put in, refresh or remove). In order:

  1. journal (preparing): every step with its old and new SHA256, the folders it will create
  2. stage each new content beside its path and an undo copy of each old content, re-read and
     hash both; build the new folder in a scratch folder beside it
  3. journal (replacing): the staged, undo and scratch paths
  4. swap each step in (os.replace; the folder by renames); check every path's SHA256
  5. journal (committed), delete the undo copies and scratch, delete the journal

A signal is taken only at a checkpoint before each step (signals.py). Up to the committed
journal, any failure or signal rolls back: each changed path gets its undo copy back by
os.replace, which needs no new disk space, so a full disk cannot stop it; staged files and
new folders go; every path is hashed again to prove it is as before. recovery.py runs the
same rollback (rollback.py) from the journal when a command was killed.
"""

from __future__ import annotations

import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn, Union

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_bytes, sha256_file, tree_digest
from k26_ddtree.patchset import journal as journals
from k26_ddtree.patchset.journal import COMMITTED, PREPARING, REPLACING, DirEntry, FileEntry, Journal
from k26_ddtree.patchset.rollback import drop_bytecode, finish, reason, roll_back, sha_of
from k26_ddtree.patchset.signals import Interrupted, Signals

# Test-only (tests/patchset/test_signals.py, test_recovery.py, test_lock.py): a folder; the
# transaction stops at each checkpoint whose pause_label has a <folder>/<label>.hold, announcing
# it by creating <folder>/<label>.paused, until the hold file is gone or a signal arrives.
PAUSE_ENV = "K26_APPLY_TEST_PAUSE"

Out = Callable[[str], None]


@dataclass(frozen=True)
class FileStep:
    path: Path
    role: str            # "sglang", "backup" or "import", for the journal
    old: bytes | None    # the content now (None: absent)
    new: bytes | None    # the content wanted (None: remove the file)


@dataclass(frozen=True)
class CopyStep:
    path: Path                             # the package copy's folder
    build: Callable[[Path], None] | None   # writes the new copy at the folder it is given; None: remove it


Step = Union[FileStep, CopyStep]


def _sha(data: bytes | None) -> str | None:
    return sha256_bytes(data) if data is not None else None


def _hold(label: str, signals: Signals) -> None:
    folder = os.environ.get(PAUSE_ENV)
    if not folder or not (Path(folder) / f"{label}.hold").exists():
        return
    (Path(folder) / f"{label}.paused").touch()
    while (Path(folder) / f"{label}.hold").exists() and signals.pending is None:
        time.sleep(0.01)


def pause_label(doing: str) -> str:
    """The test-pause label of a checkpoint, e.g. replacing+sglang+srt+server_args.py."""
    return doing.replace(" ", "+").replace("/", "+")


def _missing_dirs(site: Path, folders: set[Path]) -> list[str]:
    missing: set[Path] = set()
    for folder in folders:
        while not folder.exists() and folder != site:
            missing.add(folder)
            folder = folder.parent
    return sorted((p.relative_to(site).as_posix() for p in missing), key=lambda rel: rel.count("/"))


class _Mismatch(Exception):
    """A staged or swapped-in file does not hash as it should (disk trouble, or another writer)."""


def run(site: Path, operation: str, steps: list[Step], signals: Signals, out: Out) -> None:
    """Carry out every step or none; a failure raises UserError after the rollback, saying which."""
    _Transaction(site, operation, steps, signals, out).run()


class _Transaction:
    def __init__(self, site: Path, operation: str, steps: list[Step], signals: Signals, out: Out):
        self.site, self.steps, self.signals, self.out = site, steps, signals, out
        self.files = [s for s in steps if isinstance(s, FileStep)]
        self.copy = next((s for s in steps if isinstance(s, CopyStep)), None)
        self.entries = {s.path: FileEntry(self.rel(s.path), s.role, _sha(s.old), _sha(s.new)) for s in self.files}
        directory = None
        if self.copy is not None:
            directory = DirEntry(self.rel(self.copy.path), self.copy.path.exists(), tree_digest(self.copy.path))
        self.journal = Journal(operation, PREPARING, list(self.entries.values()), directory,
                               _missing_dirs(site, {s.path.parent for s in self.files}))
        self.doing = "staging"

    def rel(self, path: Path) -> str:
        return path.relative_to(self.site).as_posix()

    def _checkpoint(self, doing: str) -> None:
        self.doing = doing
        _hold(pause_label(doing), self.signals)
        self.signals.checkpoint()

    def run(self) -> None:
        self.signals.checkpoint()
        try:
            self.journal.write(self.site)
        except OSError as err:
            journals.path(self.site).unlink(missing_ok=True)
            raise UserError(f"{self.journal.operation}: could not write the journal {journals.path(self.site)} "
                            f"({reason(err)}); nothing changed", code=1) from None
        try:
            self._stage()
            self.doing = "writing the journal"
            self.journal.phase = REPLACING
            self.journal.write(self.site)
            for step in self.steps:
                self._checkpoint(f"{_verb(step)} {self.rel(step.path)}")
                self.out("  " + self._swap(step))
            self._checkpoint("committing")
            self._check_in_place()
            self._sync()
            self.doing = "writing the journal"
            self.journal.phase = COMMITTED
            self.journal.write(self.site)
        except BaseException as err:
            self._abort(err)
        self.out(f"verified {len(self.journal.files) + bool(self.copy)} path(s) by SHA256; committed")
        _hold(pause_label("cleaning up"), self.signals)
        left = finish(self.site, self.journal)
        if left:
            self.out(f"note: could not delete {', '.join(left)} after committing; the next k26-deploy apply deletes them")

    def _sync(self) -> None:
        folders = {(self.site / e.path).parent for e in self.journal.files}
        folders |= {(self.site / d).parent for d in self.journal.made_dirs} | {self.site}
        for folder in folders:
            atomic.fsync_dir(folder)

    def _stage(self) -> None:
        for folder in self.journal.made_dirs:
            (self.site / folder).mkdir(exist_ok=True)
        for step in self.files:
            entry = self.entries[step.path]
            for content, field in ((step.new, "staged"), (step.old, "undo")):
                if content is None:
                    continue
                self._checkpoint(f"staging {entry.path}")
                staged = atomic.stage(step.path, content)
                setattr(entry, field, self.rel(staged))
                if sha256_file(staged) != sha256_bytes(content):
                    raise _Mismatch(f"the staged copy {staged.name} does not hash as written")
        if self.copy is not None:
            directory = self.journal.directory
            self._checkpoint(f"staging {directory.path}")
            target = self.copy.path
            scratch = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.",
                                            suffix=atomic.TMP_SUFFIX))
            directory.scratch = self.rel(scratch)
            if self.copy.build is not None:
                self.copy.build(scratch / "new")
                directory.new_digest = tree_digest(scratch / "new")
        self._sync()
        self.out(f"staged and verified {len(self.steps)} path(s); swapping them in")

    def _swap(self, step: Step) -> str:
        """Put one step in place; the progress line."""
        if isinstance(step, CopyStep):
            scratch = self.site / self.journal.directory.scratch
            if step.path.exists():
                os.rename(step.path, scratch / "old")
            if step.build is None:
                return f"removed the copy {self.journal.directory.path}"
            os.rename(scratch / "new", step.path)
            return f"put in place the copy {self.journal.directory.path}"
        entry = self.entries[step.path]
        if step.new is None:
            step.path.unlink()
        else:
            os.replace(self.site / entry.staged, step.path)
        drop_bytecode(step.path)
        return f"{'removed' if step.new is None else 'added' if step.old is None else 'replaced'} {entry.path}"

    def _check_in_place(self) -> None:
        wrong = [e.path for e in self.journal.files if sha_of(self.site / e.path) != e.new_sha256]
        directory = self.journal.directory
        if directory and tree_digest(self.site / directory.path) != directory.new_digest:
            wrong.append(directory.path)
        if wrong:
            raise _Mismatch(f"after swapping in, {', '.join(wrong)} do(es) not hash as staged")

    def _abort(self, err: BaseException) -> NoReturn:
        operation = self.journal.operation
        problems = roll_back(self.site, self.journal)
        if problems:
            result = (f"the rollback could NOT restore {', '.join(problems)}; {journals.path(self.site)} keeps the "
                      "record: run `k26-deploy apply` or `k26-deploy apply --revert` to retry it")
        else:
            result = "rolled back, nothing changed (every path it touched hashes as before)"
        if isinstance(err, Interrupted):
            when = f"while {self.doing}" if self.doing.startswith("staging") else f"before {self.doing}"
            raise UserError(f"{operation} interrupted by {err.name} {when}; {result}", code=err.exit_code) from None
        if isinstance(err, (OSError, _Mismatch)):
            raise UserError(f"{operation} failed while {self.doing} ({reason(err)}); {result}", code=1) from None
        self.out(f"{operation}: unexpected error while {self.doing}; {result}")
        raise err


def _verb(step: Step) -> str:
    if isinstance(step, CopyStep):
        return "removing" if step.build is None else "replacing" if step.path.exists() else "adding"
    return "removing" if step.new is None else "adding" if step.old is None else "replacing"



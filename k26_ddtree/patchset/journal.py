"""The record of a patch-set transaction in progress: <site>/.k26-ddtree.journal, JSON.

Written whole (staged, fsynced, swapped in, its folder fsynced) before the transaction changes
anything, rewritten at each phase, deleted at the end. Finding one at the start of a command
means the last one died mid-transaction (SIGKILL, power loss); recovery.py reads it to undo
that transaction, or to finish the clean-up of one that had committed. Paths are relative to
the site, so the record stays right however the site is reached.
"""

from __future__ import annotations

import json
import os
import re
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.patchset import validate

JOURNAL_NAME = ".k26-ddtree.journal"
FORMAT = "k26-ddtree-journal/1"

PREPARING = "preparing"  # backups, new contents and undo copies being staged; nothing replaced yet
REPLACING = "replacing"  # all of it staged and verified; steps being swapped in
COMMITTED = "committed"  # every step in place; only the undo copies and scratch left to delete
PHASES = (PREPARING, REPLACING, COMMITTED)
OPERATIONS = ("apply", "revert")
ROLES = ("sglang", "backup", "import")
_STARTED = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


@dataclass
class FileEntry:
    path: str
    role: str                  # "sglang", "backup" or "import"
    old_sha256: str | None     # None: absent before the transaction
    new_sha256: str | None     # None: the transaction removes it
    staged: str | None = None  # the new content, staged beside `path`
    undo: str | None = None    # a copy of the old content beside `path`, swapped back on rollback


@dataclass
class DirEntry:
    path: str                  # the k26_ddtree copy beside sglang
    existed: bool
    old_digest: str | None
    new_digest: str | None = None  # None: the transaction removes the copy (or has not built it yet)
    scratch: str | None = None     # staging folder beside it: new/ (fresh copy), old/ (what was at path)


@dataclass
class Journal:
    operation: str             # "apply" or "revert"
    phase: str
    files: list[FileEntry]
    directory: DirEntry | None = None
    made_dirs: list[str] = field(default_factory=list)  # folders the transaction creates, parents first
    pid: int = field(default_factory=os.getpid)
    started: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))

    def describe(self) -> str:
        stopped = "after committing, before its clean-up" if self.phase == COMMITTED else f"while {self.phase}"
        return f"{self.operation} (pid {self.pid}, started {self.started}, stopped {stopped})"

    def write(self, site: Path) -> None:
        doc = {"format": FORMAT, **asdict(self)}
        atomic.replace(path(site), (json.dumps(doc, indent=1) + "\n").encode())
        atomic.fsync_dir(site)


def path(site: Path) -> Path:
    return site / JOURNAL_NAME


def read(site: Path) -> Journal | None:
    """The journal left in `site`, or None. Its paths are joined to the site and then replaced or
    deleted by the rollback, so every field is checked first (validate.py) and anything wrong
    is refused by name: a journal from elsewhere, damaged or hostile, changes nothing."""
    where = path(site)
    try:
        doc = validate.read_json(where)
    except FileNotFoundError:
        return None
    except validate.Invalid as err:
        raise UserError(f"cannot read the transaction journal {where}: {err}; "
                        "restore the files it names by hand, then delete it") from None
    try:
        return _parse(doc)
    except validate.Invalid as err:
        raise UserError(f"{where} is not a journal this k26-deploy understands: {err}; "
                        "restore the files it names by hand, then delete it") from None


def _parse(doc: object) -> Journal:
    names = {f.name for f in fields(Journal)}
    validate.fields(doc, "the top level", names | {"format"})
    if doc["format"] != FORMAT:
        raise validate.Invalid(f"its format is {validate.shown(doc['format'])}, not {FORMAT!r}")
    if doc["operation"] not in OPERATIONS:
        raise validate.Invalid(f"operation is {validate.shown(doc['operation'])}, not one of {', '.join(OPERATIONS)}")
    if doc["phase"] not in PHASES:
        raise validate.Invalid(f"phase is {validate.shown(doc['phase'])}, not one of {', '.join(PHASES)}")
    pid = doc["pid"]
    if not (isinstance(pid, int) and not isinstance(pid, bool) and pid > 0):
        raise validate.Invalid(f"pid is {validate.shown(pid)}, not a process id")
    if not (isinstance(doc["started"], str) and _STARTED.fullmatch(doc["started"])):
        raise validate.Invalid(f"started is {validate.shown(doc['started'])}, not a time such as 2026-01-31T12:00:00Z")
    entries = doc["files"]
    if not isinstance(entries, list):
        raise validate.Invalid(f"files is {validate.json_type(entries)}, not an array")
    made_dirs = doc["made_dirs"]
    if not isinstance(made_dirs, list):
        raise validate.Invalid(f"made_dirs is {validate.json_type(made_dirs)}, not an array")
    return Journal(doc["operation"], doc["phase"], [_file_entry(e, f"files[{n}]") for n, e in enumerate(entries)],
                   _dir_entry(doc["directory"]) if doc["directory"] is not None else None,
                   [validate.site_path(d, f"made_dirs[{n}]") for n, d in enumerate(made_dirs)], pid, doc["started"])


def _file_entry(entry: object, where: str) -> FileEntry:
    validate.fields(entry, where, {f.name for f in fields(FileEntry)})
    if entry["role"] not in ROLES:
        raise validate.Invalid(f"{where}.role is {validate.shown(entry['role'])}, not one of {', '.join(ROLES)}")
    return FileEntry(validate.site_path(entry["path"], f"{where}.path"), entry["role"],
                     validate.sha256(entry["old_sha256"], f"{where}.old_sha256", nullable=True),
                     validate.sha256(entry["new_sha256"], f"{where}.new_sha256", nullable=True),
                     validate.site_path(entry["staged"], f"{where}.staged", nullable=True),
                     validate.site_path(entry["undo"], f"{where}.undo", nullable=True))


def _dir_entry(entry: object) -> DirEntry:
    validate.fields(entry, "directory", {f.name for f in fields(DirEntry)})
    if not isinstance(entry["existed"], bool):
        raise validate.Invalid(f"directory.existed is {validate.json_type(entry['existed'])}, not true or false")
    return DirEntry(validate.site_path(entry["path"], "directory.path"), entry["existed"],
                    validate.sha256(entry["old_digest"], "directory.old_digest", nullable=True),
                    validate.sha256(entry["new_digest"], "directory.new_digest", nullable=True),
                    validate.site_path(entry["scratch"], "directory.scratch", nullable=True))


def remove(site: Path) -> None:
    path(site).unlink(missing_ok=True)
    atomic.fsync_dir(site)

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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError

JOURNAL_NAME = ".k26-ddtree.journal"
FORMAT = "k26-ddtree-journal/1"

PREPARING = "preparing"  # backups, new contents and undo copies being staged; nothing replaced yet
REPLACING = "replacing"  # all of it staged and verified; steps being swapped in
COMMITTED = "committed"  # every step in place; only the undo copies and scratch left to delete


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
    where = path(site)
    try:
        doc = json.loads(where.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as err:
        raise UserError(f"cannot read the transaction journal {where} ({err}); "
                        "restore the files it names by hand, then delete it") from None
    try:
        if doc.pop("format") != FORMAT:
            raise ValueError("unknown format")
        directory = doc.pop("directory")
        return Journal(files=[FileEntry(**entry) for entry in doc.pop("files")],
                       directory=DirEntry(**directory) if directory else None, **doc)
    except (KeyError, TypeError, ValueError) as err:
        raise UserError(f"{where} is not a journal this k26-deploy understands ({err.__class__.__name__}: {err}); "
                        "restore the files it names by hand, then delete it") from None


def remove(site: Path) -> None:
    path(site).unlink(missing_ok=True)
    atomic.fsync_dir(site)

"""The schedule file `k26-deploy tune` writes and `k26-deploy reconfigure --schedule-file` reads.

Torch-free, so reconfigure reads it without the tuner's imports. The file holds much more (the
table, the measured costs, provenance; tune/report.document); serving it takes two fields:
"schedule" (core.schedule's text) and "spine" (the one spine value it was planned for).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.core import schedule
from k26_ddtree.errors import UserError
from k26_ddtree.jsonread import Unreadable, read_json

SCHEMA = "k26-ddtree-tune/1"
# tune writes a few hundred KB (the table of every shape); a larger file is not one of its.
MAX_BYTES = 16 << 20


@dataclass(frozen=True)
class ScheduleFile:
    """schedule  the server's --speculative-ddtree-budget-schedule, or None where every bucket is the
                 plain chain (tune found DFLASH best at every concurrency: serve DFLASH)
    spine     the spine it was planned for"""

    schedule: str | None
    spine: bool


def read(path: Path) -> ScheduleFile:
    try:
        doc = read_json(path, f"schedule file {path}", max_bytes=MAX_BYTES)
    except FileNotFoundError:
        raise UserError(f"schedule file {path} does not exist (k26-deploy tune writes one)") from None
    except Unreadable as err:
        raise UserError(str(err)) from None
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise UserError(f"{path} is not a k26-deploy tune schedule file (no \"schema\": \"{SCHEMA}\")")
    text, spine = doc.get("schedule"), doc.get("spine")
    if not isinstance(text, str) or not isinstance(spine, bool):
        raise UserError(f"{path}: \"schedule\" must be a string and \"spine\" true or false")
    try:
        entries = schedule.parse(text)
    except schedule.ScheduleError as err:
        raise UserError(f"{path}: schedule {text!r}: {err}") from None
    return ScheduleFile(None if schedule.only_chains(entries) else text, spine)

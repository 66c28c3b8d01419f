"""The DDTree budget schedule's text form, torch-free: the server flag, the profiles, `tune` and
`reconfigure` all read and write a schedule through this module.

    "1:32/8,4:16/4,16:8/4,64:0"   bs:budget/topk per bucket, each from that batch size up to the
                                  next; the first at 1; 0 is the plain DFlash chain
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from k26_ddtree.core.budget import tree_problem

EXAMPLE = "1:32/8,4:16/4,16:8/4,64:0"
# ASCII only: \d and \s would also take other scripts' digits and spaces, which int() reads but
# which then reach the profile and the unit as they were typed.
_ENTRY = re.compile(r"\s*(\d+)\s*:\s*(?:(0)|(\d+)\s*/\s*(\d+))\s*", re.ASCII)
# Beyond any batch size, budget or topk a server could mean.
_MAX_DIGITS = 18
# The text goes into the unit's ExecStart line (normal()); a few hundred buckets fit well within this.
MAX_CHARS = 4096
# More requests than any server batches at once: a bucket starting above it is never reached.
MAX_BATCH = 1 << 16


class ScheduleError(ValueError):
    """A schedule that cannot be served; the message says which bucket and why, in one line."""


@dataclass(frozen=True)
class Entry:
    """One bucket: from batch size min_bs, `budget` nodes at `topk`; budget 0 (topk 0) is the chain."""

    min_bs: int
    budget: int
    topk: int

    @property
    def chain(self) -> bool:
        return self.budget == 0

    @property
    def text(self) -> str:
        return f"{self.min_bs}:0" if self.chain else f"{self.min_bs}:{self.budget}/{self.topk}"


def parse(text: str) -> list[Entry]:
    """The buckets of a schedule; checks what needs no block size: the syntax and the batch sizes
    increasing from 1. A schedule of chains only parses (it is linear DFLASH); serving it as a
    DDTree schedule is refused where it is served (check)."""
    if len(str(text)) > MAX_CHARS:
        raise ScheduleError(f"longer than {MAX_CHARS} characters ({len(str(text))})")
    entries = []
    for part in str(text).split(","):
        match = _ENTRY.fullmatch(part)
        if match is None:
            raise ScheduleError(f"{part.strip()!r} is not bs:budget/topk or bs:0 (as in \"{EXAMPLE}\")")
        start, chain, budget, topk = match.groups()
        if max(len(number or "") for number in (start, budget, topk)) > _MAX_DIGITS:
            raise ScheduleError(f"{part.strip()[:40]!r}: a number of more than {_MAX_DIGITS} digits")
        if chain:
            entries.append(Entry(int(start), 0, 0))
            continue
        if int(budget) < 1 or int(topk) < 1:
            raise ScheduleError(f"{part.strip()!r}: budget and topk must be >= 1 (0 alone is the chain)")
        if int(topk) > int(budget):
            raise ScheduleError(f"{part.strip()!r}: topk {int(topk)} above budget {int(budget)} (a tree of "
                                f"{int(budget)} nodes holds at most {int(budget)} children of the root): lower the topk")
        entries.append(Entry(int(start), int(budget), int(topk)))
    starts = [entry.min_bs for entry in entries]
    if starts[-1] > MAX_BATCH:
        raise ScheduleError(f"bucket {starts[-1]} starts above {MAX_BATCH} requests, more than a server batches: "
                            "it is never reached")
    if starts[0] != 1:
        raise ScheduleError(f"the first bucket must start at batch size 1, got {starts[0]}")
    if any(b <= a for a, b in zip(starts, starts[1:])):
        raise ScheduleError(f"bucket batch sizes must increase, got {', '.join(map(str, starts))}")
    return entries


def normal(text: str) -> str:
    """The schedule as the server and the unit get it: no spaces, no leading zeros (parse's checks)."""
    return ",".join(entry.text for entry in parse(text))


def only_chains(entries: list[Entry]) -> bool:
    return all(entry.chain for entry in entries)


def check(entries: list[Entry], block_size: int) -> None:
    """A DDTree schedule: some bucket is a tree, and every tree bucket is one the tree builder
    serves at this block size."""
    if only_chains(entries):
        raise ScheduleError("every bucket is the chain, which is linear DFLASH: serve DFLASH instead")
    for entry in entries:
        if entry.chain:
            continue
        problem = tree_problem(block_size - 1, entry.topk, entry.budget)
        if problem is not None:
            setting, why = problem
            raise ScheduleError(f"bucket {entry.text}: {setting} {why}")


def parse_checked(text: str, block_size: int) -> list[Entry]:
    """parse, then check: the buckets of a schedule a DDTree server of this block size serves."""
    entries = parse(text)
    check(entries, block_size)
    return entries

"""Processes as Linux /proc shows them: which are running, and which a process started."""

from __future__ import annotations

import os


def pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def alive(pid: int) -> bool:
    """Running, not a zombie: a killed child its parent has not reaped yet still answers kill(0),
    and another user's process refuses it; /proc/PID/stat tells both apart."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (children, their children, ...), from the parent links in /proc."""
    children: dict[int, list[int]] = {}
    for child in pids():
        try:
            stat = open(f"/proc/{child}/stat", encoding="ascii", errors="replace").read()
        except OSError:
            continue
        # The command name may hold spaces and parentheses; fields resume after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(child)
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found

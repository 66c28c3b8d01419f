"""Unified diffs over bytes: written deterministically, applied exactly (no fuzz, no offsets).

Bytes, not text, so a diff reproduces a file to the byte: a form feed or a
missing final newline survive (the latter as GNU diff's "\\ No newline at end
of file" marker, which `patch` understands).
"""

from __future__ import annotations

import difflib
import re

_CONTEXT = 3
_NO_EOL = b"\\ No newline at end of file\n"
_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


class PatchError(Exception):
    """A diff that does not apply exactly to the given bytes."""


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their b"\\n"; only b"\\n" ends a line (unlike bytes.splitlines)."""
    lines = data.split(b"\n")
    tail = lines.pop()
    out = [line + b"\n" for line in lines]
    if tail:
        out.append(tail)
    return out


def _range(start: int, count: int) -> bytes:
    # GNU diff's convention: an empty range names the line before it.
    if count == 0:
        return b"%d,0" % start
    if count == 1:
        return b"%d" % (start + 1)
    return b"%d,%d" % (start + 1, count)


def _emit(out: list[bytes], prefix: bytes, line: bytes) -> None:
    out.append(prefix + line)
    if not line.endswith(b"\n"):
        out.append(b"\n" + _NO_EOL)


def make_diff(old: bytes | None, new: bytes, rel: str) -> bytes:
    """`diff -u` of `old` (None: a new file) against `new`, labelled a/<rel> and b/<rel>."""
    a = split_lines(old) if old is not None else []
    b = split_lines(new)
    out = [b"--- " + (b"a/" + rel.encode() if old is not None else b"/dev/null") + b"\n",
           b"+++ b/" + rel.encode() + b"\n"]
    for group in difflib.SequenceMatcher(None, a, b, autojunk=False).get_grouped_opcodes(_CONTEXT):
        i1, i2 = group[0][1], group[-1][2]
        j1, j2 = group[0][3], group[-1][4]
        out.append(b"@@ -" + _range(i1, i2 - i1) + b" +" + _range(j1, j2 - j1) + b" @@\n")
        for tag, ai1, ai2, bj1, bj2 in group:
            if tag == "equal":
                for line in a[ai1:ai2]:
                    _emit(out, b" ", line)
                continue
            for line in a[ai1:ai2]:
                _emit(out, b"-", line)
            for line in b[bj1:bj2]:
                _emit(out, b"+", line)
    return b"".join(out)


def _start(number: bytes, count: bytes | None) -> int:
    """0-based index of a hunk side's first line (an empty side names the line before it)."""
    return int(number) - 1 if count != b"0" else int(number)


def _hunks(diff: bytes) -> list[tuple[int, int, list[bytes], list[bytes]]]:
    """(old start, new start, old lines, new lines) per hunk, starts 0-based."""
    hunks: list[tuple[int, int, list[bytes], list[bytes]]] = []
    old: list[bytes] = []
    new: list[bytes] = []
    last: tuple[list[bytes], ...] = ()
    for raw in split_lines(diff):
        match = _HUNK.match(raw)
        if match:
            old, new = [], []
            hunks.append((_start(match.group(1), match.group(2)), _start(match.group(3), match.group(4)), old, new))
            continue
        if not hunks or raw.startswith((b"--- ", b"+++ ")):
            continue
        kind, line = raw[:1], raw[1:]
        if kind == b" ":
            old.append(line)
            new.append(line)
            last = (old, new)
        elif kind == b"-":
            old.append(line)
            last = (old,)
        elif kind == b"+":
            new.append(line)
            last = (new,)
        elif raw == _NO_EOL:
            for side in last:
                side[-1] = side[-1][:-1]
        else:
            raise PatchError(f"unexpected diff line {raw[:40]!r}")
    return hunks


def apply_diff(original: bytes | None, diff: bytes, reverse: bool = False) -> bytes:
    """The bytes `diff` turns `original` into (or back, with reverse=True); PatchError if it does not fit."""
    lines = split_lines(original) if original is not None else []
    out: list[bytes] = []
    pos = 0
    for old_start, new_start, old, new in _hunks(diff):
        start = old_start
        if reverse:
            start, old, new = new_start, new, old
        if start < pos or lines[start:start + len(old)] != old:
            raise PatchError(f"hunk at line {start + 1} does not match")
        out.extend(lines[pos:start])
        out.extend(new)
        pos = start + len(old)
    out.extend(lines[pos:])
    return b"".join(out)

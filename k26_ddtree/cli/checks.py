"""Checks of flag values that several subcommands share; each failure is one UserError line."""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from urllib.parse import urlsplit

from k26_ddtree.errors import UserError


def path_arg(text: str) -> Path:
    """argparse type of a path flag. Path("") is Path("."): an empty value, such as an unset
    shell variable, would read, fill or write the current folder without a word; and a NUL
    byte, which no path can hold, would fail later as a traceback."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no directory or file; this one is empty: give a path")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} holds a NUL byte, which no path can")
    return Path(text)


def http_url(value: str, what: str, example: str) -> str:
    """`value` unless it is not an http(s) URL with a host (and a valid port, when one is given)."""
    try:
        parts = urlsplit(value)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as err:
        raise UserError(f"{what} {value!r} is not a valid URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise UserError(f"{what} {value!r} must be an http(s) URL with a host, e.g. {example}")
    return value


def seconds(flag: str, value: float, *, allow_zero: bool) -> float:
    """A wait's bound: finite (nan or inf would never expire) and positive (or zero where a
    single look is meaningful); a negative bound is a typo."""
    if not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise UserError(f"{flag} must be a finite number of seconds {bound}, got {value}")
    return value

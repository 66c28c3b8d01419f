"""Checks on what pins.json and the journal say, before any of it is used.

Both are JSON read from disk that may be hand-edited, damaged or hostile. A path in them is
joined to the site and then written, replaced or deleted, so one that climbs out of it (an
absolute path, a '..' part) would reach places no lock, journal or backup covers; a value of
the wrong type would surface as an internal exception. So each field is checked for the exact
form the toolkit itself writes, and what is wrong is said in words: which field, and why.
"""

from __future__ import annotations

import re
from pathlib import Path

from k26_ddtree import jsonread

_SHA256 = re.compile(r"[0-9a-f]{64}")
_VERSION = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+!_-]{0,63}")


class Invalid(Exception):
    """One thing wrong with a record, in words (e.g. "files[0].path is absolute")."""


def read_json(path: Path) -> object:
    """The parsed JSON at `path`; Invalid says why it cannot be read. FileNotFoundError passes
    through: whether a missing file is an error is the caller's to say."""
    try:
        return jsonread.read_json(path, "it")  # callers name the file before the reason
    except jsonread.Unreadable as err:
        raise Invalid(str(err)) from None


def json_type(value: object) -> str:
    """How a value parsed from JSON is named in a message: "an array", "null", ..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    return {dict: "an object", list: "an array", str: "a string"}.get(type(value), type(value).__name__)


def mapping(value: object, where: str) -> dict:
    if not isinstance(value, dict):
        raise Invalid(f"{where} is {json_type(value)}, not an object")
    return value


def fields(value: object, where: str, names: set[str]) -> dict:
    """`value` as an object holding exactly the fields `names`."""
    value = mapping(value, where)
    missing, unknown = sorted(names - value.keys()), sorted(value.keys() - names)
    if missing:
        raise Invalid(f"{where} lacks the field {missing[0]!r}")
    if unknown:
        raise Invalid(f"{where} has an unknown field {unknown[0]!r}")
    return value


def text(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise Invalid(f"{where} is {json_type(value)}, not a string")
    return value


def version(value: object, where: str) -> str:
    """A version string (it is printed and compared, so it must be one plain word)."""
    if not (isinstance(value, str) and _VERSION.fullmatch(value)):
        raise Invalid(f"{where} is {shown(value)}, not a version such as '0.5.11'")
    return value


def sha256(value: object, where: str, nullable: bool = False) -> str | None:
    if value is None and nullable:
        return None
    if not (isinstance(value, str) and _SHA256.fullmatch(value)):
        wanted = "a SHA256 (64 lowercase hex digits)" + (" or null" if nullable else "")
        raise Invalid(f"{where} is {shown(value)}, not {wanted}")
    return value


def site_path(value: object, where: str, nullable: bool = False) -> str | None:
    """A plain relative POSIX path inside the site, as the toolkit writes them."""
    if value is None and nullable:
        return None
    rel = text(value, where)
    if not rel:
        problem = "is empty"
    elif any(ord(char) < 0x20 or char == "\x7f" for char in rel):
        problem = "has a control character"
    elif rel.startswith("/"):
        problem = "is absolute"
    elif ".." in rel.split("/"):
        problem = "has a '..' part, so it leaves the site"
    elif {"", "."} & set(rel.split("/")):
        problem = "is not normalised (it has an empty or '.' part)"
    else:
        return rel
    raise Invalid(f"{where} {shown(rel)} {problem}")


def sglang_path(value: object, where: str) -> str:
    """A path inside the site's sglang package: the only files a patch set may touch."""
    rel = site_path(value, where)
    if not rel.startswith("sglang/"):
        raise Invalid(f"{where} {shown(rel)} is not inside sglang/")
    return rel


def shown(value: object) -> str:
    """A value quoted for a one-line message, cut short so a hostile one cannot flood it."""
    if isinstance(value, str):
        quoted = ascii(value)
        return quoted if len(quoted) <= 80 else quoted[:77] + "..."
    return json_type(value)

"""JSON the toolkit did not write, or that may have changed since: files on disk (pins.json, a
model's config.json, a results file) and answers from servers.

json.loads fails in more ways than JSONDecodeError: past about 1000 levels of nesting with a
RecursionError, on an integer longer than Python converts with a plain ValueError, on bytes that
are not UTF-8 with UnicodeDecodeError. Readers that each caught their own subset let one of the
others end a command in a traceback. Here every one becomes Unreadable, one line that names what
was read and why it cannot be used.

JSON that parses can still be too deep for what comes next: the bench's secret scrubber and its
indented results writer recurse once per level and hit the recursion limit near 500. Such a
reader passes max_depth and gets TooDeep, long before that.

An object that names a key twice is refused too: json.loads keeps the last value silently, so
the file would mean something other than what a person reading it from the top sees.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from k26_ddtree import paths
from k26_ddtree.errors import UserError

# More than any file the toolkit writes or reads as JSON (a bench results file of many runs is a
# few MB); a larger one is read by mistake.
MAX_FILE_BYTES = 256 * paths.MB


class Unreadable(ValueError):
    """JSON that cannot be used, in one line naming it ("<what> is not UTF-8 text")."""


class NotText(Unreadable):
    """Bytes that are not UTF-8: not JSON text at all."""


class _Duplicate(ValueError):
    def __init__(self, key: str):
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list) -> dict:
    found = {}
    for key, value in pairs:
        if key in found:
            raise _Duplicate(key)
        found[key] = value
    return found


class TooDeep(Unreadable):
    """JSON nested deeper than json.loads goes, or than the reader's max_depth. Under a max_depth
    the message leaves the JSON unnamed ("JSON nested deeper than 64 levels"): a reader with a
    bound of its own says where the JSON came from."""


def parse_json(data: str | bytes, what: str, max_depth: int | None = None):
    """The value of the JSON text `data` (bytes must be UTF-8); Unreadable naming it `what` when
    it is not JSON, TooDeep when it nests deeper than max_depth."""
    try:
        # Decoded here: json.loads would take UTF-16 and UTF-32 bytes too, which JSON from a
        # file or a server never rightly is.
        value = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data, object_pairs_hook=_unique_keys)
    except _Duplicate as err:
        raise Unreadable(f"{what} is not usable JSON: an object names the key {err.key[:60]!r} twice") from None
    except UnicodeDecodeError:
        raise NotText(f"{what} is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise Unreadable(f"{what} is not JSON ({err.msg}: line {err.lineno}, column {err.colno})") from None
    except ValueError:  # the one other refusal: an integer longer than Python converts
        raise Unreadable(f"{what} holds an integer of more than {sys.get_int_max_str_digits()} digits") from None
    except RecursionError:
        if max_depth is None:
            raise TooDeep(f"{what} nests deeper than the JSON reader goes") from None
        raise TooDeep(f"JSON nested deeper than {max_depth} levels") from None
    if max_depth is not None:
        pending = [(value, 1)]
        while pending:  # a loop, not recursion: the point is to stay off the recursion limit
            item, depth = pending.pop()
            if isinstance(item, (dict, list)):
                if depth > max_depth:
                    raise TooDeep(f"JSON nested deeper than {max_depth} levels")
                pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return value


def read_json(path: Path, what: str | None = None, max_depth: int | None = None,
              max_bytes: int = MAX_FILE_BYTES):
    """The parsed JSON file at `path`, named `what` (default: the path) in any Unreadable.
    FileNotFoundError passes through: whether a missing file is an error is the caller's to say.
    A path that is no regular file, or a file over max_bytes, is Unreadable too (paths.read_input)."""
    what = str(path) if what is None else what
    try:
        data = paths.read_input(Path(path), what, max_bytes)
    except UserError as err:
        raise Unreadable(str(err)) from None
    return parse_json(data, what, max_depth)

"""json.loads with a bound on nesting, for JSON from servers and from files the bench reads.

json.loads gives up near Python's recursion limit (1000 levels) with a RecursionError, which no
caller expects; and JSON it does take can still be too deep for what comes next: the secret
scrubber and the indented writer of the results file recurse once per level and hit the same
limit near 500. Every reader refuses deeper JSON as TooDeep (a ValueError, like any other JSON
that cannot be used), long before that.
"""

from __future__ import annotations

import json

# SGLang's answers nest under 10 levels; one recorded in a run (server_info) sits 3 levels down
# in the results file (runs, run, server_info), so a file may be a little deeper than an answer.
MAX_ANSWER_DEPTH = 64
MAX_FILE_DEPTH = 100


class TooDeep(ValueError):
    pass


def loads(data: str | bytes, max_depth: int):
    """The JSON value of `data`; ValueError when it is not JSON, TooDeep when it nests deeper than max_depth."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise TooDeep(f"JSON nested deeper than {max_depth} levels") from None
    pending = [(value, 1)]
    while pending:  # a loop, not recursion: the point is to stay off the recursion limit
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                raise TooDeep(f"JSON nested deeper than {max_depth} levels")
            pending.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return value

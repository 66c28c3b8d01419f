"""Read one profile YAML file strictly: a duplicate key or nesting deeper than any profile needs is an error.

PyYAML keeps the last of two equal keys without a word, and composes nested
nodes by recursion, so a file nested a thousand deep ends in RecursionError.
The loader below refuses both with the line they are on.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from k26_ddtree.errors import UserError

# The schema nests two levels (parallel.tp_size); anything much deeper is not a profile.
MAX_DEPTH = 32


class _StrictLoader(yaml.SafeLoader):
    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise yaml.composer.ComposerError(
                    None, None, f"nested deeper than {MAX_DEPTH} levels", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                name = self.construct_object(key_node, deep=deep)
                try:
                    first = seen.get(name)
                except TypeError:
                    continue  # an unhashable key: SafeConstructor reports it below
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {name!r} (first at line {first})", key_node.start_mark)
                seen[name] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> dict:
    """The mapping at the top of the profile file `path` ({} when empty)."""
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_StrictLoader)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"profile {path}{where}: {problem}") from None
    except OSError as err:
        raise UserError(f"profile {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"profile {path}: not a YAML text file (not UTF-8)") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"profile {path}: must be a mapping of keys to values, got {type(raw).__name__}")
    return raw

"""Raw profile data (YAML, JSON, `--set` text) checked against the schema and turned into its dataclasses.

Everything here follows k26_ddtree.deploy.schema: which keys exist, what type
each holds, which may be null. Every mistake is a UserError naming where the
data came from and the dotted key.
"""

from __future__ import annotations

import difflib
import types
from collections.abc import Mapping

from k26_ddtree.deploy.schema import Kind, default, keys
from k26_ddtree.errors import UserError


def check_partial(data: dict, cls: type, origin: str, prefix: str = "") -> None:
    """Unknown keys and wrong types in `data`, which may hold only some of the keys (one file of a chain)."""
    schema = keys(cls)
    for name, value in data.items():
        dotted = f"{prefix}{name}"
        kind = schema.get(name) if isinstance(name, str) else None
        if kind is None:
            close = difflib.get_close_matches(str(name), list(schema), n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known here: {', '.join(sorted(schema))}"
            raise UserError(f"{origin}: unknown key {dotted!r} ({hint})")
        if kind.section is not None:
            if not isinstance(value, dict):
                raise UserError(f"{origin}: {dotted} must be a mapping of keys, got {_show(value)}")
            check_partial(value, kind.section, origin, f"{dotted}.")
        else:
            _check_value(value, kind, origin, dotted)


def build(cls: type, data: dict, origin: str, *, fill_missing: bool = False, **fixed):
    """An instance of `cls` from `data`; `fixed` fills the fields that are not keys.

    `data` must hold every key, unless `fill_missing`: then an absent key takes its default
    (a unit rendered by an older k26-deploy lacks the keys added since).
    """
    check_partial(data, cls, origin)
    return _build(cls, data, origin, "", fill_missing, fixed)


def to_data(obj) -> dict:
    """A schema instance's keys as plain dicts, lists and scalars (for JSON and --set)."""
    out = {}
    for name, kind in keys(type(obj)).items():
        value = getattr(obj, name)
        if kind.section is not None:
            out[name] = to_data(value)
        elif isinstance(value, tuple):
            out[name] = list(value)
        elif isinstance(value, Mapping):
            out[name] = dict(value)
        else:
            out[name] = value
    return out


def apply_set(data: dict, assignment: str, root: type) -> None:
    """Apply one `--set dotted.key=value` to raw `data`, the value parsed per the schema."""
    dotted, sep, text = assignment.partition("=")
    dotted = dotted.strip()
    if not sep or not dotted:
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set speculative.budget=16")
    parts = dotted.split(".")
    node, cls = data, root
    for i, part in enumerate(parts):
        kind = keys(cls).get(part)
        last = i == len(parts) - 1
        here = ".".join(parts[:i + 1])
        if kind is not None and kind.name == "map" and i == len(parts) - 2:
            node.setdefault(part, {})[parts[-1]] = text
            return
        if kind is None:
            known = dotted_keys(root)
            close = difflib.get_close_matches(dotted, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
            raise UserError(f"--set {dotted}: unknown key ({hint})")
        if last and kind.section is not None:
            inner = dotted_keys(kind.section, f"{here}.")
            raise UserError(f"--set {dotted}: {here} is a section, set one of its keys: {', '.join(inner)}")
        if not last and kind.section is None:
            example = f"{here}.NAME=value" if kind.name == "map" else f"{here}=VALUE"
            raise UserError(f"--set {dotted}: {here} is a key, not a section (--set {example})")
        if last:
            node[part] = _parse_text(text, kind, f"--set {dotted}")
            return
        node = node.setdefault(part, {})
        cls = kind.section


def _parse_text(text: str, kind: Kind, origin: str):
    """A `--set` value: the text read as the key's kind (null, numbers, booleans, comma lists)."""
    lowered = text.strip().lower()
    if kind.nullable and not lowered:
        # An unset shell variable gives an empty value: it must not unset the key without a word.
        raise UserError(f"{origin}: the value is empty; write null to unset the key")
    if kind.nullable and lowered in ("null", "none", "~"):
        return None
    if kind.name == "int":
        try:
            return int(text)
        except ValueError:
            raise UserError(f"{origin}: must be an integer, got {text!r}") from None
    if kind.name == "float":
        try:
            return float(text)
        except ValueError:
            raise UserError(f"{origin}: must be a number, got {text!r}") from None
    if kind.name == "bool":
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise UserError(f"{origin}: must be true or false, got {text!r}")
    if kind.name == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    if kind.name == "map":
        raise UserError(f"{origin}: set one entry at a time, e.g. --set environment.NAME=value")
    return text


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    found = []
    for name, kind in keys(cls).items():
        if kind.section is not None:
            found.extend(dotted_keys(kind.section, f"{prefix}{name}."))
        else:
            found.append(f"{prefix}{name}")
    return found


def _build(cls: type, data: dict, origin: str, prefix: str, fill_missing: bool, fixed: dict):
    values = dict(fixed)
    for name, kind in keys(cls).items():
        dotted = f"{prefix}{name}"
        if name not in data and not fill_missing:
            raise UserError(f"{origin}: missing key {dotted!r} (a profile usually starts with 'extends: base')")
        if name not in data and kind.section is None:
            values[name] = default(cls, name)
            continue
        value = data.get(name, {})
        if kind.section is not None:
            value = _build(kind.section, value, origin, f"{dotted}.", fill_missing, {})
        elif isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = types.MappingProxyType(dict(value))
        values[name] = value
    return cls(**values)


def _check_value(value, kind: Kind, origin: str, key: str) -> None:
    def wrong(expected: str) -> UserError:
        return UserError(f"{origin}: {key} must be {expected}, got {_show(value)}")

    if value is None:
        if kind.nullable:
            return
        raise wrong(f"a {kind.name} (not null)")
    if kind.name in ("str", "path"):
        if not isinstance(value, str):
            raise wrong("a string")
        if not value:
            # An empty value would reach the command line as "" (e.g. --host ""), which nothing accepts.
            raise wrong("a non-empty string" + (" or null" if kind.nullable else ""))
        _check_text(value, origin, key)
        if kind.name == "path" and not value.startswith("/"):
            raise wrong("an absolute path")
    elif kind.name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif kind.name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
    elif kind.name == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false")
    elif kind.name == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong("a list of strings")
        for item in value:
            _check_text(item, origin, key)
    elif kind.name == "map":
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise wrong("a mapping of NAME: \"string value\"")
        for name, item in value.items():
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise UserError(f"{origin}: {key}: {name!r} is not a valid environment variable name")
            _check_text(item, origin, f"{key}.{name}")


def _check_text(value: str, origin: str, key: str) -> None:
    # Profile strings end up inside a unit file: a newline would start a new directive.
    if any(ord(ch) < 32 for ch in value):
        raise UserError(f"{origin}: {key} must not contain control characters (newline, tab)")


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""Write deploy/profiles/base.yaml from the schema: every key with its type, its one-line doc and its default.

    python -m k26_ddtree.deploy.basegen

base.yaml is what every profile extends, and the reference of the keys users
read; generating it keeps both equal to k26_ddtree.deploy.schema, and the test
suite fails while the committed file differs.
"""

from __future__ import annotations

import sys

import yaml

from k26_ddtree import atomic
from k26_ddtree.deploy.profiles import profiles_dir
from k26_ddtree.deploy.schema import Profile, default, doc, keys

HEADER = """\
# base: what every k26-ddtree profile shares. Other profiles start with `extends: base`
# (or the name of any shipped profile, or a path to a .yaml file) and override keys;
# nested mappings merge key by key, every other value (lists too) replaces.
# `k26-deploy render --profile P --set speculative.budget=16` overrides one key on the command line.
#
# Generated from k26_ddtree/deploy/schema.py by `python -m k26_ddtree.deploy.basegen`:
# change a key, its type, default or doc there, then regenerate; unknown keys and wrong types are errors.

"""


def base_yaml() -> str:
    return HEADER + "".join(_lines(Profile, ""))


def _lines(cls: type, indent: str):
    for name, kind in keys(cls).items():
        if kind.section is not None:
            yield f"{indent}# {name}: {doc(cls, name)}\n{indent}{name}:\n"
            yield from _lines(kind.section, indent + "  ")
        else:
            yield f"{indent}# {name} ({kind.describe()}): {doc(cls, name)}\n"
            yield f"{indent}{name}: {_value(default(cls, name))}\n"


def _value(value) -> str:
    if isinstance(value, tuple):
        value = list(value)
    elif not isinstance(value, (str, int, float, bool, type(None))):
        value = dict(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=1000)
    return text.removesuffix("\n...\n").strip()


def main() -> int:
    print(atomic.refresh_text(profiles_dir() / "base.yaml", base_yaml()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

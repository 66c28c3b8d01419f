"""The server flags of each SGLang version with a patch set, as its patched parser reads them.

One generated module per version (v0_5_11.py, ...: `python -m k26_ddtree.deploy.sglanggen`),
read from the pinned wheel with the patch set applied; this package picks one by version, so
that machines without SGLang check profiles and extra_args as that version's argparse would.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.errors import UserError

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class ServerCli:
    """One SGLang version's `sglang.launch_server` flags."""

    version: str
    # The option strings of every argument, aliases together, in parser order; argparse
    # (allow_abbrev) also takes any prefix of exactly one of them.
    options: tuple[tuple[str, ...], ...]
    # The choices of the flags profile keys set.
    choices: Mapping[str, tuple[str, ...]]
    # The flags SGLang keeps only as deprecated aliases, with the replacement its notice names ("": none).
    deprecated: Mapping[str, str]

    @functools.cached_property
    def aliases(self) -> dict[str, tuple[str, ...]]:
        """Each option string -> all option strings of its argument (--ep -> --expert-parallel-size, ...)."""
        return {option: group for group in self.options for option in group}


def module_name(version: str) -> str:
    """The generated module of `version`: 0.5.11 -> v0_5_11."""
    return "v" + version.replace(".", "_")


def versions() -> list[str]:
    """The versions with a generated table."""
    return sorted(p.stem[1:].replace("_", ".") for p in FOLDER.glob("v*.py"))


@functools.cache
def for_version(version: str) -> ServerCli:
    if version not in versions():
        raise UserError(f"k26-deploy has no flag table for SGLang {version}; it has {', '.join(versions())}")
    table = importlib.import_module(f"{__name__}.{module_name(version)}")
    return ServerCli(version, table.OPTIONS, table.CHOICES, table.DEPRECATED)

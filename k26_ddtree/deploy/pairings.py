"""Known-bad pairings of hardware and SGLang version, refused in one line wherever one is decided.

The data is sglang_versions.PINS[VERSION].fails_on. A profile's hardware is the shipped
profiles it is or extends (profiles.hardware_names). env/quickstart.sh asks before anything
is installed, with the system python (standard library only):

    python -m k26_ddtree.deploy.pairings [--sglang VERSION] [--profile PROFILE]

exit 2 and one line for an unknown version or a known-bad pairing, 0 otherwise. A profile given
as a path is checked by render once the venv exists (its `extends:` chain needs the YAML reader).
"""

from __future__ import annotations

import sys
from collections.abc import Collection

from k26_ddtree.errors import UserError
from k26_ddtree.repro.sglang_versions import PINS, KnownFailure, pins_for

USAGE = "usage: python -m k26_ddtree.deploy.pairings [--sglang VERSION] [--profile PROFILE]"


def refusal(version: str, profiles: Collection[str]) -> str | None:
    """Why SGLang `version` must not serve the hardware of `profiles` (shipped profile names); None
    when nothing is known against it."""
    found = _failure(version, profiles)
    if found is None:
        return None
    failure, name = found
    usable = [v for v in PINS if _failure(v, profiles) is None]
    instead = (f"use --sglang {' or '.join(usable)}" if usable
               else "no SGLang version k26-ddtree installs is known to run there")
    return f"SGLang {version} is known to fail on the {failure.hardware} of profile {name}: {failure.reports}; {instead}"


def _failure(version: str, profiles: Collection[str]) -> tuple[KnownFailure, str] | None:
    """The first known failure of `version` on one of `profiles`, with that profile."""
    for failure in PINS[version].fails_on:
        for name in failure.profiles:
            if name in profiles:
                return failure, name
    return None


def _shipped_name(profile: str) -> list[str]:
    """The profile as a shipped name ([] for a path, whose chain only k26-deploy can read)."""
    return [] if profile.endswith((".yaml", ".yml")) or "/" in profile else [profile]


def main(argv: list[str]) -> int:
    given = dict(zip(argv[::2], argv[1::2]))
    if len(argv) % 2 or len(given) != len(argv) // 2 or not set(given) <= {"--sglang", "--profile"}:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        version = pins_for(given.get("--sglang")).sglang
        problem = refusal(version, _shipped_name(given["--profile"]) if "--profile" in given else [])
        if problem:
            raise UserError(problem)
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

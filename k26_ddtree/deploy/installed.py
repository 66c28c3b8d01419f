"""The SGLang version a profile's python runs, and the profile rendered for it.

The unit runs `python -m sglang.launch_server`, so its flags must be those of the sglang that
python imports. That python is asked only where its package is (find_spec of a top-level name
runs no sglang code, with the environment the unit sets); the version comes from the dist-info
beside it, as `k26-deploy apply` reads it (patchset.locate). A python that is not on this
machine (rendering for another one) has none, and the profile's sglang_version stands.
"""

from __future__ import annotations

import json
import os
import subprocess

from k26_ddtree.deploy import pairings
from k26_ddtree.deploy.profiles import hardware_names, with_sets
from k26_ddtree.deploy.schema import Profile
from k26_ddtree.errors import UserError
from k26_ddtree.patchset import locate
from k26_ddtree.repro.sglang_versions import PINS, known

_FIND_SGLANG = ("import importlib.util, json; spec = importlib.util.find_spec('sglang'); "
                "print(json.dumps(list(spec.submodule_search_locations or []) if spec else []))")


def sglang_version(profile: Profile) -> str | None:
    """The version of the sglang the profile's python imports; None when that python is not here or
    has no sglang."""
    if not os.path.exists(profile.python):
        return None
    try:
        # The unit's environment: systemd's own holds little beyond PATH.
        env = {"PATH": os.environ.get("PATH", os.defpath), **profile.environment}
        proc = subprocess.run([profile.python, "-c", _FIND_SGLANG], capture_output=True, text=True, timeout=60, env=env)
        locations = json.loads(proc.stdout) if proc.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError) as err:
        raise UserError(f"python {profile.python} does not answer where its sglang is ({err})") from None
    if not isinstance(locations, list):
        last = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
        raise UserError(f"python {profile.python} does not answer where its sglang is ({last})")
    for location in locations:
        try:
            site = locate.site_from_dir(location)
        except UserError:
            continue  # a namespace portion without the package
        return locate.read_version(site)[0]
    return None


def for_installed_sglang(profile: Profile) -> tuple[Profile, str | None]:
    """`profile` with sglang_version set to the version its python has, and a note when that differs
    from the profile's; UserError for a version k26-ddtree has no patch set for or one known to fail
    on the profile's hardware."""
    installed = sglang_version(profile)
    if installed is None or installed == profile.sglang_version:
        return profile, None
    where = f"{profile.python} has sglang {installed}"
    if installed not in PINS:
        raise UserError(f"{where}, which k26-ddtree does not serve; install one it does: {known()}")
    problem = pairings.refusal(installed, hardware_names(profile))
    if problem:
        raise UserError(f"{where}: {problem}")
    note = (f"profile {profile.name} names SGLang {profile.sglang_version} (sglang_version); {where}: "
            f"the unit is written for {installed}")
    return with_sets(profile, [f"sglang_version={installed}"]), note


"""A new patch set folder is checked with no code change: test_patchset_files.py, run on a patches
folder that holds a patch set made the developer's way (one real file of the default version's
wheel changed, `regen --from`), picks it up, passes it, and fails it once one of its diffs is
broken."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from k26_ddtree.patchset.pins import DEFAULT_VERSION, diff_name
from k26_ddtree.patchset.wheel import wheel_for
from processes import REPO

pytestmark = pytest.mark.network

CHANGED = "sglang/srt/speculative/spec_info.py"
FILE_CHECKS = REPO / "tests" / "patchset" / "test_patchset_files.py"


def _check(patches, basetemp) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(FILE_CHECKS),
                           "--patches-dir", str(patches), "--basetemp", str(basetemp)],
                          capture_output=True, text=True, timeout=600, cwd=REPO, env=dict(os.environ))


def test_a_patch_set_in_a_new_folder_is_picked_up_and_checked(pristine_sglang, shipped_patch_set, tmp_path):
    tree = tmp_path / "tree"
    (tree / CHANGED).parent.mkdir(parents=True)
    (tree / CHANGED).write_bytes((pristine_sglang / CHANGED).read_bytes() + b"\nK26_NEW_PATCH_SET = True\n")
    root = tmp_path / "patches" / f"sglang-{DEFAULT_VERSION}"
    made = subprocess.run([sys.executable, "-m", "k26_ddtree.patchset.regen", "--root", str(root), "--from", str(tree),
                           "--version", DEFAULT_VERSION, "--wheel", str(wheel_for(shipped_patch_set))],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in root.iterdir()) == sorted(["pins.json", "series", diff_name(CHANGED)])

    passed = _check(tmp_path / "patches", tmp_path / "run-good")
    assert passed.returncode == 0, passed.stdout[-3000:]
    ran = [line for line in passed.stdout.splitlines() if line.startswith("PASSED ")]
    assert len(ran) >= 6 and all(line.endswith(f"[{DEFAULT_VERSION}]") for line in ran), passed.stdout[-3000:]

    diff = root / diff_name(CHANGED)
    diff.write_bytes(diff.read_bytes().replace(b"+K26_NEW_PATCH_SET = True", b"+K26_NEW_PATCH_SET = False"))
    failed = _check(tmp_path / "patches", tmp_path / "run-broken")
    assert failed.returncode == 1, failed.stdout[-3000:]
    assert f"{diff_name(CHANGED)} applied to the pinned original of {CHANGED} does not give the patched_sha256" \
        in failed.stdout, failed.stdout[-3000:]

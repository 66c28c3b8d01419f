"""Patch sets to test `k26-deploy apply` with, and fresh copies of the pristine pinned sglang.

Every lifecycle test runs against a synthetic patch set (made here from the
pristine default-version wheel with regen's --from, as a developer makes one: two
edited files and one added file) and against the shipped patch set of
pins.DEFAULT_VERSION.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from k26_ddtree.patchset import regen
from k26_ddtree.patchset.lock import LOCK_NAME
from k26_ddtree.patchset.pins import DEFAULT_VERSION, root_for
from k26_ddtree.patchset.wheel import wheel_for
from sites import copy_site, write_tree


@pytest.fixture(scope="session")
def shipped_patch_set(patches_dir) -> Path:
    return root_for(DEFAULT_VERSION, patches_dir)


@pytest.fixture(scope="session")
def synthetic_patch_set(pristine_sglang, shipped_patch_set, tmp_path_factory) -> Path:
    tree = write_tree(pristine_sglang, tmp_path_factory.mktemp("synthetic-tree"))
    root = tmp_path_factory.mktemp("synthetic-patch-set")
    regen.regenerate(root, tree, wheel_for(shipped_patch_set), DEFAULT_VERSION, out=lambda line: None)
    return root


@pytest.fixture(params=["synthetic", "shipped"])
def patch_set(request) -> Path:
    return request.getfixturevalue(f"{request.param}_patch_set")


@pytest.fixture
def site(pristine_sglang, shipped_patch_set, tmp_path) -> Path:
    return copy_site(pristine_sglang, tmp_path / "site", (shipped_patch_set,))


@pytest.fixture
def make_site(pristine_sglang, shipped_patch_set):
    """make_site(dest): a pristine site dir like `site`, at a place of the test's choosing."""
    return lambda dest: copy_site(pristine_sglang, dest, (shipped_patch_set,))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


@pytest.fixture
def snapshot():
    """snapshot(root): every file under root (path -> bytes), to prove a refused command changed nothing.
    The site's lock file is left out: apply and --revert create it, and it stays (lock.py says why)."""
    return _snapshot

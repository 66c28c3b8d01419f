"""The shipped patch set of one SGLang version applied to its pristine sources, first on sys.path."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from k26_ddtree.patchset import apply, importable
from k26_ddtree.patchset.pins import root_for

_ON_SYS_PATH: dict[str, Path] = {}  # version -> the patched site put on sys.path


def patch_and_import(version: str, pristine_sources, patches_dir: Path, tmp_path_factory) -> Path:
    """The pristine sglang of `version`, patched with its shipped patch set by apply's own code,
    first on sys.path; one version per test process, since sglang is imported once."""
    other = [v for v in _ON_SYS_PATH if v != version]
    if other:
        pytest.fail(f"sglang {other[0]} is already on sys.path in this test process; run the tests of "
                    f"sglang {version} in a process of their own")
    if version not in _ON_SYS_PATH:
        pristine = pristine_sources(version)
        site = tmp_path_factory.mktemp(f"sglang-{version}-patched")
        shutil.copytree(pristine / "sglang", site / "sglang")
        for dist_info in pristine.glob("*.dist-info"):
            shutil.copytree(dist_info, site / dist_info.name)
        apply.apply(site, root_for(version, patches_dir), out=lambda line: None)
        importable.undo(site)  # the tests import the checkout's k26_ddtree, not a copy beside sglang
        sys.path.insert(0, str(site))
        _ON_SYS_PATH[version] = site
    return _ON_SYS_PATH[version]

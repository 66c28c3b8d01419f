"""The pinned SGLang, patched, importable on a CPU-only machine.

`patched_sglang` copies the pristine sglang of a version (tests/conftest.py),
patches it with `k26-deploy apply`'s own code and that version's patch set, and
puts it at the front of sys.path (the stubs for sgl_kernel and torchvision are
there from the session's start: tests/conftest.py). The version is
pins.DEFAULT_VERSION, or the one a test names by indirect parametrization
(`@pytest.mark.parametrize("patched_sglang", [VERSION], indirect=True)`); one
version per test process, since sglang is imported once. Tests import sglang
modules inside the test body, after requesting the fixture.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from k26_ddtree.patchset import apply, importable
from k26_ddtree.patchset.pins import DEFAULT_VERSION, root_for
from server_args_support import QWEN3

_ON_SYS_PATH: dict[str, Path] = {}  # version -> the patched site put on sys.path


@pytest.fixture(scope="session")
def patched_sglang(request, pristine_sources, patches_dir, tmp_path_factory) -> Path:
    version = getattr(request, "param", DEFAULT_VERSION)
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


@pytest.fixture
def models(tmp_path):
    """A tiny target config and a DFlash drafter config with block_size 8."""
    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(QWEN3))
    draft = tmp_path / "draft"
    draft.mkdir()
    draft_config = dict(QWEN3, architectures=["DFlashDraftModel"], num_hidden_layers=2)
    draft_config["dflash_config"] = {
        "target_layer_ids": [1, 2],
        "mask_token": "<|MASK|>",
        "mask_token_id": 2,
        "block_size": 8,
    }
    (draft / "config.json").write_text(json.dumps(draft_config))
    return str(target), str(draft)

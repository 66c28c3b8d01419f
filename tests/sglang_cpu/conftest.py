"""The pinned SGLang, patched, importable on a CPU-only machine.

`patched_sglang` copies the pristine pinned sglang (tests/conftest.py), patches
it with `k26-deploy apply`'s own code using a patch set regenerated from the
current full/ files (so a full/ file edited since the last regen is still what
gets tested), and puts it at the front of sys.path (the stubs for sgl_kernel and torchvision are
there from the session's start: tests/conftest.py). Tests import sglang modules inside the test body, after
requesting the fixture.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from k26_ddtree.patchset import apply, importable, regen
from k26_ddtree.patchset.pins import FULL_DIR, PINS_FILE, SERIES_FILE
from k26_ddtree.patchset.wheel import shipped_wheel
from server_args_support import QWEN3

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches" / "sglang-0.5.11"


@pytest.fixture(scope="session")
def patched_sglang(pristine_sglang, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("sglang-patched")
    shutil.copytree(pristine_sglang / "sglang", site / "sglang")
    for dist_info in pristine_sglang.glob("*.dist-info"):
        shutil.copytree(dist_info, site / dist_info.name)
    if regen.full_files(PATCHES):
        patch_set = tmp_path_factory.mktemp("patch-set")
        shutil.copyfile(PATCHES / PINS_FILE, patch_set / PINS_FILE)
        (patch_set / FULL_DIR).symlink_to(PATCHES / FULL_DIR)
        regen.regenerate(patch_set, shipped_wheel(), out=lambda line: None)
        if (patch_set / SERIES_FILE).read_text().strip():  # empty while every full/ file is still pristine
            apply.apply(site, patch_set, out=lambda line: None)
            importable.undo(site)  # the tests import the checkout's k26_ddtree, not a copy beside sglang
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return site


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

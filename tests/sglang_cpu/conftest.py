"""The pinned SGLang, patched, importable on a CPU-only machine.

`patched_sglang` copies the pristine sglang of a version (tests/conftest.py),
patches it with `k26-deploy apply`'s own code and that version's patch set, and
puts it at the front of sys.path (the stubs for sgl_kernel and torchvision are
there from the session's start: tests/conftest.py). The version is
pins.DEFAULT_VERSION, or the one a test names by indirect parametrization
(`@pytest.mark.parametrize("patched_sglang", [VERSION], indirect=True)`); one
version per test process, since sglang is imported once (v0_5_17/ holds 0.5.17's tests,
run in a process and venv of their own). Tests import sglang modules inside the test body, after
requesting the fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from k26_ddtree.patchset.pins import DEFAULT_VERSION
from sglang_patched_site import patch_and_import
from server_args_support import QWEN3


@pytest.fixture(scope="session")
def patched_sglang(request, pristine_sources, patches_dir, tmp_path_factory) -> Path:
    return patch_and_import(getattr(request, "param", DEFAULT_VERSION), pristine_sources, patches_dir,
                            tmp_path_factory)


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

"""SGLang 0.5.17, patched with patches/sglang-0.5.17, importable on a CPU-only machine.

These tests need their own venv (env/requirements-sglang-0.5.17-cpu.txt: 0.5.17's transformers
and xgrammar, not the 0.5.11 suite's), and a process whose sglang is 0.5.17: set
K26_SGLANG_VERSION=0.5.17 to run them; without it they skip. `patched_sglang` downloads the pinned
wheel once into the wheel cache (tests/conftest.py's), checks it and every original file against
pins.json, overlays the full/ files and puts the result at the front of sys.path. Tests import
sglang modules inside the test body, after requesting the fixture.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from k26_ddtree.patchset.wheel import default_cache

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches" / "sglang-0.5.17"
VERSION = "0.5.17"
PIP_TAGS = ["--only-binary", ":all:", "--platform", "manylinux_2_34_x86_64", "--python-version", "3.11",
            "--implementation", "cp", "--abi", "cp311"]


def pytest_collection_modifyitems(config, items):
    if os.environ.get("K26_SGLANG_VERSION") == VERSION:
        return
    skip = pytest.mark.skip(reason=f"SGLang {VERSION} tests run in their own venv with K26_SGLANG_VERSION={VERSION}")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _wheel(pins: dict) -> Path:
    cache = default_cache()
    wheel = cache / pins["wheel"]["filename"]
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *PIP_TAGS,
                        f"sglang=={VERSION}", "-d", str(cache)], check=True, timeout=600)
    assert _sha256(wheel.read_bytes()) == pins["wheel"]["sha256"], f"{wheel} does not match pins.json"
    return wheel


@pytest.fixture(scope="session")
def patched_sglang(tmp_path_factory) -> Path:
    pins = json.loads((PATCHES / "pins.json").read_text())
    assert pins["sglang_version"] == VERSION
    site = tmp_path_factory.mktemp("sglang-0.5.17-patched")
    with zipfile.ZipFile(_wheel(pins)) as zf:
        zf.extractall(site, [m for m in zf.namelist() if m.startswith(("sglang/", f"sglang-{VERSION}.dist-info/"))])
    for rel, pin in pins["files"].items():
        target = site / rel
        assert _sha256(target.read_bytes()) == pin["original_sha256"], f"{rel}: not the pinned original"
        patched = (PATCHES / "full" / rel).read_bytes()
        assert _sha256(patched) == pin["patched_sha256"], f"{rel}: full/ differs from pins.json"
        shutil.copyfile(PATCHES / "full" / rel, target)
    sys.path.insert(0, str(site))
    return site


@pytest.fixture
def models(tmp_path):
    """A tiny target config and a DFlash drafter config with block_size 8."""
    from v0517_support import QWEN3

    target = tmp_path / "target"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(QWEN3))
    draft = tmp_path / "draft"
    draft.mkdir()
    draft_config = dict(QWEN3, architectures=["DFlashDraftModel"], num_hidden_layers=2)
    draft_config["dflash_config"] = {"target_layer_ids": [1, 2], "mask_token": "<|MASK|>", "mask_token_id": 2,
                                     "block_size": 8}
    (draft / "config.json").write_text(json.dumps(draft_config))
    return str(target), str(draft)

"""The pinned SGLang, patched, importable on a CPU-only machine.

`patched_sglang` unpacks the pinned wheel (downloaded once per test run into
$K26_WHEEL_CACHE), lays the patch set's full files over it and puts it, plus the
stubs for sgl_kernel and torchvision, at the front of sys.path. Tests import
sglang modules inside the test body, after requesting the fixture.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PATCHES = REPO / "patches" / "sglang-0.5.11"
STUBS = Path(__file__).resolve().parent / "stubs"
WHEEL_NAME = "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"


def pinned_wheel() -> Path:
    cache = Path(os.environ.get("K26_WHEEL_CACHE") or REPO / ".cache" / "wheels")
    cache.mkdir(parents=True, exist_ok=True)
    wheel = cache / WHEEL_NAME
    if not wheel.exists():
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "sglang==0.5.11", "-d", str(cache)],
            check=True,
        )
    return wheel


@pytest.fixture(scope="session")
def pristine_sglang(tmp_path_factory) -> Path:
    """A directory holding the pristine pinned `sglang` package (read-only by convention)."""
    site = tmp_path_factory.mktemp("sglang-pristine")
    with zipfile.ZipFile(pinned_wheel()) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/") or m.startswith("sglang-0.5.11.dist-info/")]
        zf.extractall(site, members)
    return site


@pytest.fixture(scope="session")
def patched_sglang(pristine_sglang, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("sglang-patched")
    shutil.copytree(pristine_sglang / "sglang", site / "sglang")
    full = PATCHES / "full"
    if full.is_dir():
        for src in full.rglob("*.py"):
            dst = site / src.relative_to(full)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
    for path in (str(STUBS), str(site)):
        if path not in sys.path:
            sys.path.insert(0, path)
    return site


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()

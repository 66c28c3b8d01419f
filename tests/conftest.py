"""Fixtures shared across test areas: the pinned SGLang wheel and its pristine sources.

The wheel is downloaded once per test run into $K26_WHEEL_CACHE (tests/run.sh
makes one per run; without it, .cache/wheels in the checkout) and checked
against the SHA256 in patches/sglang-0.5.11/pins.json.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from k26_ddtree.patchset.wheel import shipped_wheel as pinned_wheel


@pytest.fixture(scope="session")
def pristine_sglang(tmp_path_factory) -> Path:
    """A site directory holding the pristine pinned `sglang` package and its dist-info (read-only by convention)."""
    site = tmp_path_factory.mktemp("sglang-pristine")
    with zipfile.ZipFile(pinned_wheel()) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/") or m.startswith("sglang-0.5.11.dist-info/")]
        zf.extractall(site, members)
    return site

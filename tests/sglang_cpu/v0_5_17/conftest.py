"""SGLang 0.5.17, patched with patches/sglang-0.5.17, importable on a CPU-only machine.

These tests need a venv of 0.5.17's CPU-side requirements (env/requirements-sglang-cpu-0.5.17.txt:
its transformers and xgrammar, not the 0.5.11 suite's) and a process whose sglang is 0.5.17:
tests/run.sh runs them so, with K26_SGLANG_VERSION=0.5.17; without it they skip. The fixtures are
tests/sglang_cpu/conftest.py's, `patched_sglang` here of 0.5.17.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sglang_patched_site import patch_and_import

VERSION = "0.5.17"


def pytest_collection_modifyitems(config, items):
    if os.environ.get("K26_SGLANG_VERSION") == VERSION:
        return
    skip = pytest.mark.skip(reason=f"SGLang {VERSION} tests run in their own venv with K26_SGLANG_VERSION={VERSION}")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def patched_sglang(pristine_sources, patches_dir, tmp_path_factory) -> Path:
    return patch_and_import(VERSION, pristine_sources, patches_dir, tmp_path_factory)

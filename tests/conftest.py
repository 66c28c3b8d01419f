"""Fixtures shared across test areas: the pinned SGLang wheel and its pristine sources.

On a machine without GPU builds of sgl_kernel and torchvision, their stubs
(tests/sglang_cpu/stubs) go on sys.path before any test runs: transformers
decides once, and caches, whether torchvision exists, so the stub must be
visible before the first test imports transformers, or sglang's config modules
(imported later by the sglang_cpu tests) find transformers half-initialised.

The wheel is downloaded once per test run into $K26_WHEEL_CACHE (tests/run.sh
makes one per run; without it, .cache/wheels in the checkout) and checked
against the SHA256 in patches/sglang-0.5.11/pins.json.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import zipfile
from pathlib import Path

import pytest

from k26_ddtree.patchset.wheel import shipped_wheel as pinned_wheel

STUBS = Path(__file__).resolve().parent / "sglang_cpu" / "stubs"
# core_cases (seeded draft inputs, hand-made trees, walk targets) serves every test area.
CORE_CASES = Path(__file__).resolve().parent / "core"


def pytest_configure(config) -> None:
    # A suite started in the background of a non-interactive shell (`nohup ... &`) inherits SIGINT
    # ignored, and so would every process a test starts: the Ctrl-C tests' SIGINT would go
    # unheard. A handler here is reset to the default in each exec'd child, as in a terminal.
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, str(CORE_CASES))
    if importlib.util.find_spec("torchvision") is None or importlib.util.find_spec("sgl_kernel") is None:
        sys.path.insert(0, str(STUBS))


@pytest.fixture(scope="session")
def pristine_sglang(tmp_path_factory) -> Path:
    """A site directory holding the pristine pinned `sglang` package and its dist-info (read-only by convention)."""
    site = tmp_path_factory.mktemp("sglang-pristine")
    with zipfile.ZipFile(pinned_wheel()) as zf:
        members = [m for m in zf.namelist() if m.startswith("sglang/") or m.startswith("sglang-0.5.11.dist-info/")]
        zf.extractall(site, members)
    return site

"""Fixtures shared across test areas: the pinned SGLang wheel and its pristine sources.

On a machine without GPU builds of sgl_kernel and torchvision, their stubs
(tests/sglang_cpu/stubs) go on sys.path before any test runs: transformers
decides once, and caches, whether torchvision exists, so the stub must be
visible before the first test imports transformers, or sglang's config modules
(imported later by the sglang_cpu tests) find transformers half-initialised.

Each SGLang version with a patch set (patches/sglang-VERSION/) has its pinned
wheel, downloaded once per test run into $K26_WHEEL_CACHE (tests/run.sh makes
one per run; without it, .cache/wheels in the checkout) and checked against the
SHA256 in that patch set's pins.json. A test that needs no particular version
gets pins.DEFAULT_VERSION's. A test that asks for `patch_set_version` runs once
per patch set in the patches folder: patches/, or the one --patches-dir names.
"""

from __future__ import annotations

import importlib.util
import signal
import sys
import zipfile
from pathlib import Path

import pytest

from k26_ddtree.patchset.pins import DEFAULT_VERSION, patches_folder, root_for, shipped_versions
from k26_ddtree.patchset.wheel import wheel_for

STUBS = Path(__file__).resolve().parent / "sglang_cpu" / "stubs"
# core_cases (seeded draft inputs, hand-made trees, walk targets) serves every test area.
CORE_CASES = Path(__file__).resolve().parent / "core"


def pytest_addoption(parser) -> None:
    parser.addoption("--patches-dir", type=Path, default=None, metavar="FOLDER",
                     help="the folder of patch sets (sglang-VERSION/) the tests use (default: the shipped patches/)")


def _patches(config) -> Path:
    return config.getoption("patches_dir") or patches_folder()


def pytest_generate_tests(metafunc) -> None:
    if "patch_set_version" in metafunc.fixturenames:
        metafunc.parametrize("patch_set_version", shipped_versions(_patches(metafunc.config)), scope="session")


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
def patches_dir(pytestconfig) -> Path:
    """The folder of patch sets under test: patches/, or --patches-dir."""
    return _patches(pytestconfig)


@pytest.fixture(scope="session")
def pristine_sources(patches_dir, tmp_path_factory):
    """pristine_sources(version=DEFAULT_VERSION): a site directory holding the pristine `sglang`
    package and its dist-info from the wheel that version's patch set pins; one per version per
    run, read-only by convention."""
    made: dict[str, Path] = {}

    def sources(version: str = DEFAULT_VERSION) -> Path:
        if version not in made:
            site = tmp_path_factory.mktemp(f"sglang-{version}-pristine")
            with zipfile.ZipFile(wheel_for(root_for(version, patches_dir))) as zf:
                members = [m for m in zf.namelist()
                           if m.startswith("sglang/") or m.startswith(f"sglang-{version}.dist-info/")]
                zf.extractall(site, members)
            made[version] = site
        return made[version]

    return sources


@pytest.fixture(scope="session")
def pristine_sglang(request, pristine_sources) -> Path:
    """pristine_sources() of the version a test names by indirect parametrization, else of DEFAULT_VERSION."""
    return pristine_sources(getattr(request, "param", DEFAULT_VERSION))

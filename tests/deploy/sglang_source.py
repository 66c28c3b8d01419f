"""The pinned SGLang sources the deploy tests read, and the pinned sglang-router, unpacked to run from.

The wheels are downloaded at most once per test run into $K26_WHEEL_CACHE
(tests/run.sh sets it; the one network access the suite allows). A patched
server_args.py is the pinned wheel's with that version's patch-set diff applied
exactly, as `k26-deploy apply` writes it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from k26_ddtree.patchset.pins import DEFAULT_VERSION, load, root_for
from k26_ddtree.patchset.wheel import wheel_for

REPO = Path(__file__).resolve().parents[2]
SERVER_ARGS = "sglang/srt/server_args.py"
# The sglang_cpu stand-ins for sgl_kernel and torchvision, which have no build beside the CPU torch.
STUBS = REPO / "tests" / "sglang_cpu" / "stubs"


def process_version() -> str:
    """The SGLang version whose own sources this test process can import: tests/run.sh runs 0.5.17's
    in a venv of its own with K26_SGLANG_VERSION=0.5.17, the rest with the default's."""
    return os.environ.get("K26_SGLANG_VERSION") or DEFAULT_VERSION


def pinned_wheel(requirement: str) -> Path:
    """The wheel of `requirement` (NAME==VERSION), downloaded once into the cache."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    cache = Path(os.environ.get("K26_WHEEL_CACHE") or REPO / ".cache" / "wheels")
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(cache)],
            check=True, timeout=600,
        )
        found = sorted(cache.glob(pattern))
    if not found:
        raise FileNotFoundError(f"pip download left no {pattern} in {cache}")
    return found[0]


def unpacked_wheel(requirement: str) -> Path:
    """A folder holding the wheel's files, for PYTHONPATH (a pure or abi3 wheel runs from there unchanged)."""
    wheel = pinned_wheel(requirement)
    folder = wheel.with_suffix("")
    if not folder.is_dir():
        staging = folder.with_name(folder.name + ".partial")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(staging)
        staging.rename(folder)
    return folder


def patched_server_args(version: str) -> str:
    """server_args.py of `version`'s pinned wheel with its patch set's diff applied."""
    patch_set = load(root_for(version))
    pin = next(pin for pin in patch_set.files if pin.rel == SERVER_ARGS)
    with zipfile.ZipFile(wheel_for(patch_set.root)) as zf:
        return patch_set.patched_bytes(pin, zf.read(SERVER_ARGS)).decode("utf-8")

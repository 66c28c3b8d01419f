"""The pinned SGLang wheel: downloaded once into a cache directory, checked against its SHA256 pin."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_file
from k26_ddtree.patchset.pins import SGLANG_VERSION, WheelPin
from k26_ddtree.resources import source_root

# The platform tags are spelled out so every host downloads the same file the pin names,
# whatever its own Python or glibc.
WHEEL_FILENAME = f"sglang-{SGLANG_VERSION}-cp311-cp311-manylinux_2_34_x86_64.whl"
_PIP_TAGS = ["--only-binary", ":all:", "--platform", "manylinux_2_34_x86_64",
             "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311"]
_DOWNLOAD_TIMEOUT_S = 600


def default_cache() -> Path:
    """$K26_WHEEL_CACHE (tests/run.sh sets one per run), else .cache/wheels in the checkout."""
    env = os.environ.get("K26_WHEEL_CACHE")
    if env:
        return Path(env)
    root = source_root()
    return (root if root is not None else Path.cwd()) / ".cache" / "wheels"


def pinned_wheel(pin: WheelPin | None, cache: Path | None = None) -> Path:
    """Path of the pinned wheel in `cache`, downloading it (no dependencies) when absent.

    With a pin, the file must match its SHA256; without one (first regen) it is taken as is.
    """
    cache = Path(cache) if cache is not None else default_cache()
    filename = pin.filename if pin is not None else WHEEL_FILENAME
    wheel = cache / filename
    if not wheel.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading sglang=={SGLANG_VERSION} (no dependencies) into {cache}", file=sys.stderr)
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *_PIP_TAGS,
               f"sglang=={SGLANG_VERSION}", "-d", str(cache)]
        try:
            subprocess.run(cmd, check=True, timeout=_DOWNLOAD_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            raise UserError(f"could not download sglang=={SGLANG_VERSION}: {err}") from None
        if not wheel.is_file():
            raise UserError(f"pip did not produce {filename} in {cache}")
    if pin is not None:
        actual = sha256_file(wheel)
        if actual != pin.sha256:
            raise UserError(f"{wheel} has SHA256 {actual}, the pin is {pin.sha256}")
    return wheel


def shipped_wheel(cache: Path | None = None) -> Path:
    """The wheel the shipped patch set is pinned to (tests and regen share this one download)."""
    from k26_ddtree.patchset.pins import default_root, read_wheel_pin

    return pinned_wheel(read_wheel_pin(default_root()), cache)

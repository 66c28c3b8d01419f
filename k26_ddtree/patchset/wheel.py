"""The SGLang wheel a patch set is pinned to: downloaded once into a cache folder, checked
against its SHA256 pin."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from k26_ddtree.atomic import TMP_SUFFIX
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_file
from k26_ddtree.patchset.pins import DEFAULT_VERSION, WheelPin, read_wheel_pin, root_for
from k26_ddtree.resources import source_root

_DOWNLOAD_TIMEOUT_S = 600


def default_cache() -> Path:
    """$K26_WHEEL_CACHE (tests/run.sh sets one per run), else .cache/wheels in the checkout."""
    env = os.environ.get("K26_WHEEL_CACHE")
    if env:
        return Path(env)
    root = source_root()
    return (root if root is not None else Path.cwd()) / ".cache" / "wheels"


def _pip_tags(filename: str) -> list[str]:
    """pip's flags for the interpreter and platform a wheel's file name is built for
    (sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl: CPython 3.11 on manylinux 2.34), so
    every host downloads the very file the pin names, whatever its own Python or glibc."""
    python, abi, platform = filename[:-len(".whl")].split("-")[-3:]
    tag = python.split(".")[0]
    implementation, digits = tag[:2], tag[2:]
    flags = ["--only-binary", ":all:", "--implementation", implementation,
             "--python-version", f"{digits[0]}.{digits[1:]}" if len(digits) > 1 else digits]
    flags += [flag for name in abi.split(".") for flag in ("--abi", name)]
    return flags + [flag for name in platform.split(".") for flag in ("--platform", name)]


def _download(pin: WheelPin, cache: Path) -> None:
    """Put pin.filename into `cache` whole: pip downloads into a scratch folder beside it."""
    cache.mkdir(parents=True, exist_ok=True)
    requirement = f"sglang=={pin.sglang_version}"
    print(f"downloading {pin.filename} ({requirement}, no dependencies) into {cache}", file=sys.stderr)
    scratch = Path(tempfile.mkdtemp(dir=cache, prefix=".download.", suffix=TMP_SUFFIX))
    try:
        cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", *_pip_tags(pin.filename),
               requirement, "-d", str(scratch)]
        try:
            subprocess.run(cmd, check=True, timeout=_DOWNLOAD_TIMEOUT_S)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as err:
            raise UserError(f"could not download {requirement}: {err}") from None
        got = sorted(p.name for p in scratch.iterdir())
        if got != [pin.filename]:
            raise UserError(f"pip downloaded {', '.join(got) or 'nothing'} for {requirement}, "
                            f"not the pinned {pin.filename}")
        os.replace(scratch / pin.filename, cache / pin.filename)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def pinned_wheel(pin: WheelPin, cache: Path | None = None) -> Path:
    """The pinned wheel in `cache`, downloaded when absent; refused unless it matches its SHA256."""
    cache = Path(cache) if cache is not None else default_cache()
    wheel = cache / pin.filename
    if not wheel.is_file():
        _download(pin, cache)
    actual = sha256_file(wheel)
    if actual != pin.sha256:
        raise UserError(f"{wheel} has SHA256 {actual}, the pin is {pin.sha256}")
    return wheel


def wheel_for(root: Path, cache: Path | None = None) -> Path:
    """The wheel the patch set at `root` is pinned to (its pins.json names the version and file)."""
    pin = read_wheel_pin(root)
    if pin is None:
        raise UserError(f"no patch set at {root}: it has no pins.json to name its wheel")
    return pinned_wheel(pin, cache)


def shipped_wheel(version: str = DEFAULT_VERSION, cache: Path | None = None) -> Path:
    """The wheel the shipped patch set of `version` is pinned to."""
    return wheel_for(root_for(version), cache)


def check_is_sglang(wheel: Path, version: str) -> None:
    """Refuse a file that is not the wheel of sglang `version` (a new patch set's --wheel), by its
    name (sglang-VERSION-...whl with its three tags, which the download reads) and its dist-info."""
    tags = r"(-[A-Za-z0-9_.]+){3,4}"
    if not re.fullmatch(rf"sglang-{re.escape(version)}{tags}\.whl", wheel.name):
        raise UserError(f"{wheel.name} is not named as a wheel of sglang {version} is "
                        f"(sglang-{version}-PYTHON-ABI-PLATFORM.whl)")
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = set(archive.namelist())
    except (OSError, zipfile.BadZipFile) as err:
        raise UserError(f"{wheel} is not a wheel ({err})") from None
    if f"sglang-{version}.dist-info/METADATA" not in names:
        raise UserError(f"{wheel} is not the wheel of sglang {version} (it has no sglang-{version}.dist-info)")

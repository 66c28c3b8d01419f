"""The committed patch set is consistent: pins, series, diffs and full/ files agree with the pinned wheel."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
import zipfile

import pytest

from k26_ddtree.patchset import regen
from k26_ddtree.hashing import sha256_bytes, sha256_file
from k26_ddtree.patchset.pins import (FULL_DIR, PINS_FILE, SERIES_FILE, default_root, diff_name, load,
                                      read_wheel_pin)
from k26_ddtree.patchset.udiff import apply_diff
from k26_ddtree.patchset.wheel import shipped_wheel

SHIPPED = default_root()

pytestmark = pytest.mark.skipif(not regen.full_files(SHIPPED), reason="the shipped patch set has no full/ files yet")


@pytest.fixture(scope="module")
def pristine_files():
    """{rel: bytes or None} of the pinned files, read from the SHA256-checked wheel."""
    with zipfile.ZipFile(shipped_wheel()) as archive:
        names = set(archive.namelist())
        return {pin.rel: archive.read(pin.rel) if pin.rel in names else None for pin in load(SHIPPED).files}


def test_the_wheel_matches_its_pin():
    pin = read_wheel_pin(SHIPPED)
    wheel = shipped_wheel()
    assert wheel.name == pin.filename
    assert sha256_file(wheel) == pin.sha256


def test_committed_diffs_series_and_pins_are_regenerated_from_full():
    wheel = shipped_wheel()
    expected = regen.generated(SHIPPED, wheel, read_wheel_pin(SHIPPED), out=lambda line: None)
    stale = [name for name, data in expected.items()
             if not (SHIPPED / name).is_file() or (SHIPPED / name).read_bytes() != data]
    extra = sorted(p.name for p in SHIPPED.glob("*.diff") if p.name not in expected)
    assert not stale and not extra, f"run python -m k26_ddtree.patchset.regen (stale: {stale}, extra: {extra})"


def test_series_names_one_diff_per_pinned_file():
    patch_set = load(SHIPPED)
    series = (SHIPPED / SERIES_FILE).read_text().split()
    assert series == [diff_name(pin.rel) for pin in patch_set.files]
    assert all((SHIPPED / name).is_file() for name in series)


def test_pins_hash_the_pristine_and_full_files(pristine_files):
    for pin in load(SHIPPED).files:
        original = pristine_files[pin.rel]
        assert (sha256_bytes(original) if original is not None else None) == pin.original_sha256, pin.rel
        assert sha256_file(SHIPPED / FULL_DIR / pin.rel) == pin.patched_sha256, pin.rel


def test_each_diff_turns_the_pristine_file_into_the_full_file_and_back(pristine_files):
    patch_set = load(SHIPPED)
    for pin in patch_set.files:
        diff = patch_set.diff_file(pin.rel).read_bytes()
        full = (SHIPPED / FULL_DIR / pin.rel).read_bytes()
        assert apply_diff(pristine_files[pin.rel], diff) == full, pin.rel
        if pin.original_sha256 is not None:
            assert apply_diff(full, diff, reverse=True) == pristine_files[pin.rel], pin.rel


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed (.ci/run installs it)")
def test_the_series_applies_with_gnu_patch(pristine_files, tmp_path):
    for rel, data in pristine_files.items():
        if data is not None:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes(data)
    for name in (SHIPPED / SERIES_FILE).read_text().split():
        subprocess.run(["patch", "-p1", "-F0", "-N", "-s", "--no-backup-if-mismatch", "-d", str(tmp_path),
                        "-i", str(SHIPPED / name)], check=True, timeout=60)
    for pin in load(SHIPPED).files:
        assert (tmp_path / pin.rel).read_bytes() == (SHIPPED / FULL_DIR / pin.rel).read_bytes(), pin.rel


def test_every_patched_python_file_compiles(tmp_path):
    for rel in regen.full_files(SHIPPED):
        if rel.endswith(".py"):
            py_compile.compile(str(SHIPPED / FULL_DIR / rel), cfile=str(tmp_path / "out.pyc"), doraise=True)


def test_pins_name_the_pinned_sglang():
    assert load(SHIPPED).sglang_version == "0.5.11"
    assert (SHIPPED / PINS_FILE).read_bytes().endswith(b"}\n")

"""Every patch set in the patches folder (patches/, or --patches-dir) is whole and true to its pinned
wheel, one run of each test per patch set: the wheel matches its pin, each diff applies exactly to
its pinned original and gives the pinned patched file, the series lists exactly the diffs, the files
are as `regen --from` writes them, and `k26-deploy apply`, `--check` and `--revert` round-trip on a
copy of the wheel's real sources."""

from __future__ import annotations

import py_compile
import shutil
import subprocess
import sys
import zipfile

import pytest

from k26_ddtree.hashing import sha256_bytes, sha256_file
from k26_ddtree.patchset import regen
from k26_ddtree.patchset.pins import SERIES_FILE, diff_name, load, read_wheel_pin, root_for
from k26_ddtree.patchset.udiff import apply_diff
from k26_ddtree.patchset.wheel import check_is_sglang, wheel_for
from processes import REPO
from sites import copy_site

pytestmark = pytest.mark.network


@pytest.fixture(scope="session")
def root(patch_set_version, patches_dir):
    return root_for(patch_set_version, patches_dir)


@pytest.fixture(scope="session")
def originals(root):
    """{rel: bytes, or None for a file the patch set adds}, read from the SHA256-checked wheel."""
    with zipfile.ZipFile(wheel_for(root)) as archive:
        names = set(archive.namelist())
        return {pin.rel: archive.read(pin.rel) if pin.rel in names else None for pin in load(root).files}


@pytest.fixture(scope="session")
def patched(root, originals):
    """{rel: the patched file}, each the pinned original with its diff applied."""
    patch_set = load(root)
    return {pin.rel: patch_set.patched_bytes(pin, originals[pin.rel]) for pin in patch_set.files}


def test_the_folder_is_named_for_the_version_its_wheel_is(root, patch_set_version):
    pin = read_wheel_pin(root)
    wheel = wheel_for(root)
    assert pin.sglang_version == patch_set_version
    assert wheel.name == pin.filename and sha256_file(wheel) == pin.sha256
    check_is_sglang(wheel, patch_set_version)


def test_the_series_lists_exactly_the_diffs(root):
    series = (root / SERIES_FILE).read_text().splitlines()
    assert series == [diff_name(pin.rel) for pin in load(root).files]
    assert sorted(p.name for p in root.glob("*.diff")) == sorted(series)


def test_each_diff_turns_its_pinned_original_into_the_pinned_patched_file_and_back(root, originals, patched):
    patch_set = load(root)
    for pin in patch_set.files:
        original = originals[pin.rel]
        assert (sha256_bytes(original) if original is not None else None) == pin.original_sha256, pin.rel
        assert sha256_bytes(patched[pin.rel]) == pin.patched_sha256, pin.rel
        if original is not None:
            assert apply_diff(patched[pin.rel], patch_set.diff_bytes(pin), reverse=True) == original, pin.rel


def test_the_files_are_as_regen_writes_them(root, tmp_path):
    regen.expand(root, tmp_path / "tree", out=lambda line: None)
    expected = regen.generated(tmp_path / "tree", wheel_for(root), read_wheel_pin(root), out=lambda line: None)
    committed = {name: (root / name).read_bytes() for name in expected if (root / name).is_file()}
    assert committed == expected, f"rewrite them with: python -m k26_ddtree.patchset.regen --root {root} --from DIR"


@pytest.mark.skipif(shutil.which("patch") is None, reason="GNU patch is not installed (.ci/run installs it)")
def test_the_series_applies_with_gnu_patch(root, originals, patched, tmp_path):
    for rel, data in originals.items():
        if data is not None:
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes(data)
    for name in (root / SERIES_FILE).read_text().split():
        subprocess.run(["patch", "-p1", "-F0", "-N", "-s", "--no-backup-if-mismatch", "-d", str(tmp_path),
                        "-i", str(root / name)], check=True, timeout=60)
    for rel, data in patched.items():
        assert (tmp_path / rel).read_bytes() == data, rel


def test_every_patched_python_file_compiles(patched, tmp_path):
    for rel, data in patched.items():
        if rel.endswith(".py"):
            source = tmp_path / "source.py"
            source.write_bytes(data)
            py_compile.compile(str(source), cfile=str(tmp_path / "out.pyc"), dfile=rel, doraise=True)


def _apply(site, root, *mode: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree", "apply", "--sglang-dir", str(site),
                           "--patch-set", str(root), *mode], capture_output=True, text=True, timeout=300, cwd=REPO)


def test_apply_check_and_revert_round_trip_on_the_wheels_sources(root, patch_set_version, pristine_sources,
                                                                snapshot, patched, tmp_path):
    site = copy_site(pristine_sources(patch_set_version), tmp_path / "site", (root,))
    pristine = snapshot(site)
    applied = _apply(site, root)
    assert applied.returncode == 0 and f"applied: {len(patched)} file(s) patched" in applied.stdout, applied.stderr
    assert {rel: (site / rel).read_bytes() for rel in patched} == patched
    check = _apply(site, root, "--check")
    assert check.returncode == 0 and check.stdout.splitlines()[-1] == "state: applied", check.stdout + check.stderr
    reverted = _apply(site, root, "--revert")
    assert reverted.returncode == 0 and f"reverted: {len(patched)} file(s) restored" in reverted.stdout, reverted.stderr
    assert snapshot(site) == pristine
    check = _apply(site, root, "--check")
    assert check.returncode == 1 and check.stdout.splitlines()[-1] == "state: pristine", check.stdout + check.stderr

"""regen: deterministic output, stale diffs dropped, untouched full/ files skipped, wrong paths refused."""

from __future__ import annotations

import shutil

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset import regen
from k26_ddtree.patchset.pins import FULL_DIR, SERIES_FILE, default_root, load, read_wheel_pin
from k26_ddtree.patchset.wheel import pinned_wheel, shipped_wheel


@pytest.fixture
def workspace(synthetic_patch_set, tmp_path):
    root = tmp_path / "patch-set"
    shutil.copytree(synthetic_patch_set, root)
    return root


def test_regenerating_twice_changes_nothing(workspace):
    assert regen.regenerate(workspace, shipped_wheel(), out=lambda line: None) == []


def test_stale_diffs_go_and_pristine_copies_are_skipped(workspace, pristine_sglang):
    (workspace / "sglang.srt.gone.diff").write_text("--- a/x\n")
    untouched = "sglang/srt/speculative/spec_info.py"
    shutil.copyfile(pristine_sglang / untouched, workspace / FULL_DIR / untouched)
    lines = []
    changed = regen.regenerate(workspace, shipped_wheel(), out=lines.append)
    assert changed == ["sglang.srt.gone.diff (removed)"]
    assert f"skipping full/{untouched}: identical to the pristine file" in lines
    assert untouched not in {pin.rel for pin in load(workspace).files}
    assert len((workspace / SERIES_FILE).read_text().split()) == 3


def test_files_outside_the_sglang_package_are_refused(workspace):
    stray = workspace / FULL_DIR / "other" / "x.py"
    stray.parent.mkdir(parents=True)
    stray.write_text("X = 1\n")
    with pytest.raises(UserError, match="full/sglang"):
        regen.regenerate(workspace, shipped_wheel(), out=lambda line: None)


def test_a_wheel_that_is_not_the_pinned_one_is_refused(workspace, tmp_path):
    fake = tmp_path / "sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl"
    fake.write_bytes(b"not the wheel")
    with pytest.raises(UserError, match="does not match the wheel SHA256"):
        regen.regenerate(workspace, fake, out=lambda line: None)


def test_a_cached_wheel_with_the_wrong_hash_is_refused(tmp_path):
    pin = read_wheel_pin(default_root())
    (tmp_path / pin.filename).write_bytes(b"truncated download")
    with pytest.raises(UserError, match="the pin is"):
        pinned_wheel(pin, tmp_path)

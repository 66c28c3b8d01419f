"""A target reached through a symlink (the file itself or a folder above it) is refused by name,
by apply and by revert, and the link and what it points to are left exactly as they were."""

from __future__ import annotations

import os
import shutil

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset import apply
from processes import SECOND_TARGET, SERVER_ARGS, run


def _link(path, tmp_path):
    """Move `path` (a file or folder) out of the site and leave a symlink to it in its place."""
    moved = tmp_path / "elsewhere" / path.name
    moved.parent.mkdir(exist_ok=True)
    shutil.move(path, moved)
    path.symlink_to(moved)
    return moved


def test_a_symlinked_target_file_is_refused_and_left_a_link(site, synthetic_patch_set, tmp_path, snapshot):
    target = site / SERVER_ARGS
    moved = _link(target, tmp_path)
    before = snapshot(site), moved.read_bytes()
    refused = run(site, synthetic_patch_set)
    assert refused.proc.returncode == 2
    assert refused.stderr.splitlines() == [
        f"k26-deploy: error: refusing to patch: {SERVER_ARGS} (server_args.py is a symlink to {moved}; "
        "apply replaces regular files only: put a copy of the file or folder in place of the link); nothing changed"]
    assert target.is_symlink() and os.readlink(target) == str(moved)
    assert (snapshot(site), moved.read_bytes()) == before
    check = run(site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 2 and "state: foreign-modified" in check.stdout


def test_a_symlinked_folder_on_the_way_is_refused(site, synthetic_patch_set, tmp_path, snapshot):
    folder = site / "sglang/srt/speculative"
    _link(folder, tmp_path)
    before = snapshot(site)
    with pytest.raises(UserError) as refused:
        apply.apply(site, synthetic_patch_set, out=lambda line: None)
    assert refused.value.code == 2
    assert f"{SECOND_TARGET} (speculative is a symlink to " in str(refused.value)
    assert folder.is_symlink() and snapshot(site) == before


def test_revert_refuses_a_target_turned_into_a_symlink(site, synthetic_patch_set, tmp_path, snapshot):
    apply.apply(site, synthetic_patch_set, out=lambda line: None)
    target = site / SERVER_ARGS
    moved = _link(target, tmp_path)
    before = snapshot(site), moved.read_bytes()
    with pytest.raises(UserError, match=f"refusing to revert: {SERVER_ARGS} .*is a symlink to {moved}"):
        apply.revert(site, synthetic_patch_set, out=lambda line: None)
    assert target.is_symlink() and (snapshot(site), moved.read_bytes()) == before

"""A failed apply leaves the site byte for byte as it was (no backups, no k26_ddtree copy, no
staged files) and only then says "nothing changed": a real immutable file, a real read-only
mount (both need root and a filesystem that has them; skipped otherwise)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from k26_ddtree.patchset import apply
from k26_ddtree.patchset.journal import JOURNAL_NAME
from k26_ddtree.patchset.lock import LOCK_NAME
from processes import SECOND_TARGET, run, staged_leftovers

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="chattr +i and mount need root")


def _try(*cmd: str) -> None:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"{' '.join(cmd)}: {done.stderr.strip()}")


@pytest.fixture
def immutable(site):
    target = site / SECOND_TARGET
    _try("chattr", "+i", str(target))
    yield target
    subprocess.run(["chattr", "-i", str(target)], check=True)


@pytest.fixture
def read_only_folder(site):
    folder = site / Path(SECOND_TARGET).parent
    _try("mount", "--bind", str(folder), str(folder))
    try:
        _try("mount", "-o", "remount,ro,bind", str(folder))
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def _assert_failed_cleanly(site, patch_set, snapshot, doing: str, reason: str) -> None:
    before = snapshot(site)
    failed = run(site, patch_set)
    assert failed.proc.returncode == 1
    assert failed.stderr.splitlines() == [
        f"k26-deploy: error: apply failed while {doing} ({reason}); "
        "rolled back, nothing changed (every path it touched hashes as before)"]
    assert snapshot(site) == before
    assert not (site / apply.BACKUP_DIR).exists() and not (site / "k26_ddtree").exists()
    assert not staged_leftovers(site) and not (site / JOURNAL_NAME).exists()


def test_an_immutable_target_fails_cleanly(immutable, site, synthetic_patch_set, snapshot):
    _assert_failed_cleanly(site, synthetic_patch_set, snapshot, f"replacing {SECOND_TARGET}", "Operation not permitted")


def test_a_read_only_folder_fails_cleanly(read_only_folder, site, synthetic_patch_set, snapshot):
    _assert_failed_cleanly(site, synthetic_patch_set, snapshot, f"staging {SECOND_TARGET}", "Read-only file system")


@pytest.fixture
def read_only_site(site):
    _try("mount", "--bind", str(site), str(site))
    try:
        _try("mount", "-o", "remount,ro,bind", str(site))
        yield site
    finally:
        subprocess.run(["umount", str(site)], check=True)


def test_check_still_works_on_a_read_only_site_and_apply_says_why_not(site, synthetic_patch_set, request):
    apply.apply(site, synthetic_patch_set, out=lambda line: None)  # leaves the lock file, as apply and --revert do
    request.getfixturevalue("read_only_site")
    check = run(site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 0, check.text()
    assert check.stdout.splitlines()[-1] == "state: applied"
    refused = run(site, synthetic_patch_set, "--revert")
    assert refused.proc.returncode == 2
    assert refused.stderr.splitlines() == [
        f"k26-deploy: error: cannot open the lock file {site / LOCK_NAME} (Read-only file system); nothing changed"]


def test_check_on_a_read_only_site_that_never_had_a_lock_file_reads_it_unlocked(read_only_site, synthetic_patch_set):
    check = run(read_only_site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 1, check.text()
    assert check.stdout.splitlines()[-1] == "state: pristine"
    assert not (read_only_site / LOCK_NAME).exists()

"""apply -> check -> apply again -> revert -> check -> tamper -> refused, on a real unpacked pinned sglang."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset import apply, pins
from k26_ddtree.patchset.journal import JOURNAL_NAME
from k26_ddtree.patchset.locate import locate
from k26_ddtree.hashing import sha256_file
from k26_ddtree.patchset.pins import DEFAULT_VERSION, diff_name, load
from k26_ddtree.patchset.status import APPLIED, FOREIGN, PARTIAL, PRISTINE, WRONG_VERSION, inspect


class Lines(list):
    def __call__(self, line: str) -> None:
        self.append(line)

    @property
    def text(self) -> str:
        return "\n".join(self)


def _state(site, patch_set) -> str:
    return inspect(locate(site), load(patch_set)).state


def _all_hashes_are(site, patch_set, which: str) -> bool:
    for pin in load(patch_set).files:
        path = site / pin.rel
        digest = sha256_file(path) if path.exists() else None
        if digest != getattr(pin, which):
            return False
    return True


def test_full_lifecycle(site, patch_set, snapshot):
    pristine = snapshot(site / "sglang")
    out = Lines()
    assert apply.check(site, patch_set, out=out) == 1
    assert "state: pristine" in out.text

    out = Lines()
    assert apply.apply(site, patch_set, out=out) == 0
    assert _all_hashes_are(site, patch_set, "patched_sha256")
    assert "applied:" in out.text and "verified" in out.text

    out = Lines()
    assert apply.check(site, patch_set, out=out) == 0
    assert "state: applied" in out.text

    out = Lines()
    assert apply.apply(site, patch_set, out=out) == 0
    assert "already applied" in out.text

    out = Lines()
    assert apply.revert(site, patch_set, out=out) == 0
    assert "reverted:" in out.text
    assert snapshot(site / "sglang") == pristine
    assert not (site / apply.BACKUP_DIR).exists()
    assert not (site / "k26_ddtree").exists()
    assert apply.check(site, patch_set, out=Lines()) == 1

    tampered = load(patch_set).files[0]
    target = site / tampered.rel
    target.write_bytes((target.read_bytes() if target.exists() else b"") + b"# local edit\n")
    before = snapshot(site)
    with pytest.raises(UserError) as refused:
        apply.apply(site, patch_set, out=Lines())
    assert refused.value.code == 2
    assert tampered.rel in str(refused.value) and "nothing changed" in str(refused.value)
    assert snapshot(site) == before
    out = Lines()
    assert apply.check(site, patch_set, out=out) == 2
    assert f"state: {FOREIGN}" in out.text


def test_backups_hold_the_originals(site, patch_set, pristine_sglang):
    apply.apply(site, patch_set, out=Lines())
    installation = locate(site)
    for pin in load(patch_set).files:
        backup = apply.backup_root(installation) / pin.rel
        if pin.original_sha256 is None:
            assert not backup.exists()
        else:
            assert backup.read_bytes() == (pristine_sglang / pin.rel).read_bytes()


def test_wrong_version_is_refused_by_every_mode(site, patch_set, snapshot):
    metadata = next(site.glob("sglang-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text().replace(f"Version: {DEFAULT_VERSION}", "Version: 0.5.10", 1))
    before = snapshot(site)
    for command in (apply.apply, apply.revert):
        with pytest.raises(UserError) as refused:
            command(site, patch_set, out=Lines())
        assert "0.5.10" in str(refused.value) and refused.value.code == 2
    out = Lines()
    assert apply.check(site, patch_set, out=out) == 2
    assert f"state: {WRONG_VERSION}" in out.text
    assert snapshot(site) == before


def test_a_version_without_a_shipped_patch_set_is_refused_naming_those_there_are(site, snapshot):
    metadata = next(site.glob("sglang-*.dist-info")) / "METADATA"
    metadata.write_text(metadata.read_text().replace(f"Version: {DEFAULT_VERSION}", "Version: 0.0.1", 1))
    known = pins.shipped_versions()
    assert DEFAULT_VERSION in known and "0.0.1" not in known
    before = snapshot(site)
    for command in (apply.apply, apply.revert, apply.check):
        with pytest.raises(UserError) as refused:
            command(site, out=Lines())
        assert str(refused.value) == (
            f"sglang 0.0.1 is installed and k26-ddtree has no patch set for it (it has patch sets for sglang "
            f"{', '.join(known)}); install one of those, or name a patch set with --patch-set; nothing changed")
        assert refused.value.code == 2
    assert snapshot(site) == before


def test_the_versions_with_a_patch_set_are_the_folders_with_pins(tmp_path):
    for folder, pins_file in [("sglang-0.5.9", True), ("sglang-0.10.0", True), ("sglang-1.0", False), ("other-2.0", True)]:
        (tmp_path / folder).mkdir()
        if pins_file:
            (tmp_path / folder / "pins.json").write_text("{}")
    assert pins.shipped_versions(tmp_path) == ["0.5.9", "0.10.0"]
    assert pins.root_for("0.10.0", tmp_path) == tmp_path / "sglang-0.10.0"
    with pytest.raises(UserError, match=r"no patch set for it \(it has patch sets for sglang 0.5.9, 0.10.0\)"):
        pins.root_for("1.0", tmp_path)
    with pytest.raises(UserError, match=r"no patch set for it \(it has none\)"):
        pins.root_for("1.0", tmp_path / "sglang-1.0")


def test_patch_set_versions_sort_as_versions_whatever_their_words():
    odd = ["0.5.11rc1", "abc", "0.5.9", "0.5.11", "0.5.11.post1", "0.5.11.1", "0.10.0"]
    assert sorted(odd, key=pins._version_key)[:2] == ["0.5.9", "0.5.11"]
    assert sorted(odd, key=pins._version_key)[-1] == "abc"


def test_the_installed_version_picks_its_shipped_patch_set(site):
    out = Lines()
    assert apply.check(site, out=out) == 1
    assert f"patch set {pins.root_for(DEFAULT_VERSION)} (for sglang {DEFAULT_VERSION}, " in out.text


def test_partial_state_is_reported_and_completed(site, synthetic_patch_set):
    apply.apply(site, synthetic_patch_set, out=Lines())
    first = load(synthetic_patch_set).files[0]
    backup = apply.backup_root(locate(site)) / first.rel
    (site / first.rel).write_bytes(backup.read_bytes())
    assert _state(site, synthetic_patch_set) == PARTIAL
    out = Lines()
    assert apply.check(site, synthetic_patch_set, out=out) == 1
    assert f"state: {PARTIAL}" in out.text
    assert apply.apply(site, synthetic_patch_set, out=Lines()) == 0
    assert _state(site, synthetic_patch_set) == APPLIED


def test_revert_without_backups_runs_the_diffs_backwards(site, synthetic_patch_set, snapshot):
    pristine = snapshot(site / "sglang")
    apply.apply(site, synthetic_patch_set, out=Lines())
    for backup in (site / apply.BACKUP_DIR).rglob("*.py"):
        backup.unlink()
    assert apply.revert(site, synthetic_patch_set, out=Lines()) == 0
    assert snapshot(site / "sglang") == pristine


def test_a_failure_part_way_rolls_back_everything(site, synthetic_patch_set, monkeypatch, snapshot):
    before = snapshot(site)
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        if Path(dst).is_relative_to(site / "sglang"):
            calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(UserError) as failed:
        apply.apply(site, synthetic_patch_set, out=Lines())
    monkeypatch.setattr(os, "replace", real_replace)
    assert failed.value.code == 1
    assert str(failed.value) == (
        "apply failed while replacing sglang/srt/speculative/dflash_utils.py (No space left on device); "
        "rolled back, nothing changed (every path it touched hashes as before)")
    # the backups and the k26_ddtree copy this apply had put in are gone too
    assert snapshot(site) == before
    assert not (site / apply.BACKUP_DIR).exists() and not (site / "k26_ddtree").exists()
    assert _state(site, synthetic_patch_set) == PRISTINE
    assert not [p for p in site.rglob("*.k26-tmp")] and not (site / JOURNAL_NAME).exists()


def test_dry_run_changes_nothing(site, synthetic_patch_set, snapshot):
    before = snapshot(site)
    out = Lines()
    assert apply.apply(site, synthetic_patch_set, dry_run=True, out=out) == 0
    assert "dry run: would patch 3 file(s)" in out.text
    assert snapshot(site) == before
    apply.apply(site, synthetic_patch_set, out=Lines())
    after_apply = snapshot(site)
    out = Lines()
    assert apply.revert(site, synthetic_patch_set, dry_run=True, out=out) == 0
    assert "dry run: would restore 3 file(s)" in out.text
    assert snapshot(site) == after_apply


def test_permissions_kept_and_stale_bytecode_dropped(site, synthetic_patch_set):
    rel = "sglang/srt/server_args.py"
    target = site / rel
    os.chmod(target, 0o640)
    cache = target.parent / "__pycache__"
    cache.mkdir(exist_ok=True)
    stale = cache / "server_args.cpython-311.pyc"
    stale.write_bytes(b"stale")
    apply.apply(site, synthetic_patch_set, out=Lines())
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert not stale.exists()
    added = site / "sglang/srt/speculative/k26_probe.py"
    assert stat.S_IMODE(added.stat().st_mode) == 0o644


def test_foreign_file_blocks_revert_too(site, synthetic_patch_set, snapshot):
    apply.apply(site, synthetic_patch_set, out=Lines())
    target = site / "sglang/srt/server_args.py"
    target.write_bytes(target.read_bytes() + b"# edited after patching\n")
    before = snapshot(site)
    with pytest.raises(UserError) as refused:
        apply.revert(site, synthetic_patch_set, out=Lines())
    assert "sglang/srt/server_args.py" in str(refused.value)
    assert snapshot(site) == before


def test_missing_patch_set_is_a_clear_error(site, tmp_path):
    with pytest.raises(UserError, match=f"no patch set at {tmp_path / 'nowhere'}: it has no pins.json"):
        apply.check(site, tmp_path / "nowhere", out=Lines())


SERVER_ARGS_DIFF = diff_name("sglang/srt/server_args.py")


@pytest.mark.parametrize("break_diff, says", [
    (lambda diff: diff.replace(b"+K26_PATCHSET_PROBE = 1", b"+K26_PATCHSET_PROBE = 2"),
     f"{SERVER_ARGS_DIFF} applied to the pinned original of sglang/srt/server_args.py does not give the "
     "patched_sha256 in pins.json; nothing changed"),
    (lambda diff: diff.replace(b"\n ", b"\n #", 1),
     f"{SERVER_ARGS_DIFF} does not apply to the pinned original of sglang/srt/server_args.py (hunk at line "),
    (None, f"is incomplete: {SERVER_ARGS_DIFF} (the diff of sglang/srt/server_args.py) is missing; nothing changed"),
])
def test_a_diff_that_does_not_give_the_pinned_patched_file_is_refused(break_diff, says, site, synthetic_patch_set,
                                                                      tmp_path, snapshot):
    broken = tmp_path / "broken-patch-set"
    shutil.copytree(synthetic_patch_set, broken)
    diff = broken / SERVER_ARGS_DIFF
    if break_diff is None:
        diff.unlink()
    else:
        diff.write_bytes(break_diff(diff.read_bytes()))
    before = snapshot(site)
    for dry_run in (True, False):
        with pytest.raises(UserError) as refused:
            apply.apply(site, broken, dry_run=dry_run, out=Lines())
        assert refused.value.code == 2 and says in str(refused.value), str(refused.value)
        assert str(refused.value).startswith(f"the patch set at {broken} is ")
    assert snapshot(site) == before


def test_a_rollback_that_cannot_finish_says_so_and_the_next_command_finishes_it(site, synthetic_patch_set,
                                                                               monkeypatch, snapshot):
    before = snapshot(site)
    real_replace = os.replace
    first, second = (str(site / rel) for rel in ("sglang/srt/server_args.py", "sglang/srt/speculative/dflash_utils.py"))
    seen = []

    def failing_replace(src, dst):
        seen.append(str(dst))
        if str(dst) == second or (str(dst) == first and seen.count(first) == 2):
            raise OSError(5, "Input/output error")  # the swap in, then the rollback of the one before
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing_replace)
    with pytest.raises(UserError) as failed:
        apply.apply(site, synthetic_patch_set, out=Lines())
    monkeypatch.setattr(os, "replace", real_replace)
    message = str(failed.value)
    assert failed.value.code == 1 and "nothing changed" not in message
    assert message.startswith("apply failed while replacing sglang/srt/speculative/dflash_utils.py (Input/output error); "
                              "the rollback could NOT restore sglang/srt/server_args.py (Input/output error); ")
    assert (site / JOURNAL_NAME).is_file()

    out = Lines()
    assert apply.revert(site, synthetic_patch_set, out=out) == 0
    assert out[0].startswith("found an interrupted apply (pid ")
    assert snapshot(site) == before

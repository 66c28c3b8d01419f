"""regen: --expand writes the patched files, --from the diffs; deterministic, for any patch set
folder, its version and wheel read from its pins.json; wrong trees, wheels and folders refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.hashing import sha256_file
from k26_ddtree.patchset import regen
from k26_ddtree.patchset.pins import DEFAULT_VERSION, PINS_FILE, SERIES_FILE, WheelPin, diff_name, load, read_wheel_pin
from k26_ddtree.patchset.wheel import _pip_tags, pinned_wheel, wheel_for
from processes import REPO
from sites import ADDED, EDITED

QUIET = {"out": lambda line: None}


def _listing(root):
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def workspace(synthetic_patch_set, tmp_path):
    """A copy of the synthetic patch set, and its patched files expanded beside it."""
    root = tmp_path / "patch-set"
    shutil.copytree(synthetic_patch_set, root)
    regen.expand(root, tmp_path / "tree", **QUIET)
    return root, tmp_path / "tree"


def regen_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree.patchset.regen", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_expand_writes_the_patched_files_and_from_then_changes_nothing(workspace, pristine_sglang):
    root, tree = workspace
    assert sorted(_listing(tree)) == sorted([*EDITED, *ADDED])
    for rel, edit in EDITED.items():
        assert (tree / rel).read_bytes() == edit((pristine_sglang / rel).read_bytes())
    before = _listing(root)
    assert regen.regenerate(root, tree, **QUIET) == []
    assert regen.regenerate(root, tree, **QUIET) == []
    assert _listing(root) == before


def test_an_edit_a_new_file_and_a_reset_file_each_change_the_patch_set(workspace, pristine_sglang):
    root, tree = workspace
    edited, added, reset = "sglang/srt/server_args.py", "sglang/srt/k26_other.py", "sglang/srt/speculative/dflash_utils.py"
    (tree / edited).write_bytes((tree / edited).read_bytes() + b"K26_SECOND_PROBE = 2\n")
    (tree / added).write_bytes(b"OTHER = 1\n")
    shutil.copyfile(pristine_sglang / reset, tree / reset)
    lines = []
    changed = regen.regenerate(root, tree, out=lines.append)
    assert sorted(changed) == sorted([PINS_FILE, SERIES_FILE, diff_name(added), diff_name(edited),
                                      f"{diff_name(reset)} (removed)"])
    assert f"{added}: not in {read_wheel_pin(root).filename}, so the patch set adds it" in lines
    assert any(line.startswith("left out 1 file(s) identical to") and line.endswith(reset) for line in lines)
    pins = {pin.rel: pin for pin in load(root).files}
    assert sorted(pins) == sorted([edited, added, *ADDED]) and pins[added].original_sha256 is None
    assert regen.regenerate(root, tree, **QUIET) == []


def test_it_works_on_any_patch_set_folder_taking_version_and_wheel_from_its_pins(workspace, tmp_path):
    root, tree = workspace
    moved = tmp_path / "elsewhere" / "sglang-any"
    shutil.copytree(root, moved)
    done = regen_cli("--root", str(moved), "--expand", str(tmp_path / "again"))
    assert done.returncode == 0, done.stderr
    assert _listing(tmp_path / "again") == _listing(tree)
    done = regen_cli("--root", str(moved), "--from", str(tmp_path / "again"))
    assert done.returncode == 0 and done.stdout.endswith(f"3 patched file(s) for sglang {DEFAULT_VERSION}; nothing changed\n")


def test_a_new_patch_set_takes_version_and_wheel(workspace, tmp_path):
    root, tree = workspace
    wheel = wheel_for(root)
    fresh = tmp_path / "fresh"
    refused = regen_cli("--root", str(fresh), "--from", str(tree))
    assert refused.returncode == 2 and refused.stderr == (
        f"regen: error: {fresh} has no {PINS_FILE}: a new patch set needs --version and --wheel\n")
    wrong = regen_cli("--root", str(fresh), "--from", str(tree), "--version", "0.5.9", "--wheel", str(wheel))
    assert wrong.returncode == 2 and wrong.stderr == (
        f"regen: error: {wheel.name} is not named as a wheel of sglang 0.5.9 is "
        "(sglang-0.5.9-PYTHON-ABI-PLATFORM.whl)\n")
    renamed = tmp_path / wheel.name.replace(DEFAULT_VERSION, "0.5.9")
    shutil.copyfile(wheel, renamed)
    wrong = regen_cli("--root", str(fresh), "--from", str(tree), "--version", "0.5.9", "--wheel", str(renamed))
    assert wrong.returncode == 2 and wrong.stderr == (
        f"regen: error: {renamed} is not the wheel of sglang 0.5.9 (it has no sglang-0.5.9.dist-info)\n")
    assert not fresh.exists()
    made = regen_cli("--root", str(fresh), "--from", str(tree), "--version", DEFAULT_VERSION, "--wheel", str(wheel))
    assert made.returncode == 0, made.stderr
    assert _listing(fresh) == _listing(root)


def test_a_version_or_wheel_other_than_the_pinned_one_is_refused(workspace, tmp_path):
    root, tree = workspace
    before = _listing(root)
    fake = tmp_path / read_wheel_pin(root).filename
    fake.write_bytes(b"not the wheel")
    with pytest.raises(UserError, match="does not match the wheel SHA256"):
        regen.regenerate(root, tree, fake, **QUIET)
    with pytest.raises(UserError, match=f"--version 0.5.9, but .* pins sglang {DEFAULT_VERSION}"):
        regen.regenerate(root, tree, version="0.5.9", **QUIET)
    assert _listing(root) == before


def test_a_tree_without_sglang_or_with_leftovers_or_unchanged_is_refused(workspace, tmp_path, pristine_sglang):
    root, tree = workspace
    before = _listing(root)
    with pytest.raises(UserError, match="has no sglang/ folder: --from takes the folder that holds sglang/"):
        regen.regenerate(root, tree / "sglang", **QUIET)
    leftover = tree / "sglang/srt/server_args.py.orig"
    leftover.write_text("X = 1\n")
    with pytest.raises(UserError, match="server_args.py.orig looks like a leftover"):
        regen.regenerate(root, tree, **QUIET)
    leftover.unlink()
    for rel in [*EDITED, *ADDED]:
        (tree / rel).unlink()
    shutil.copyfile(pristine_sglang / "sglang/srt/server_args.py", tree / "sglang/srt/server_args.py")
    with pytest.raises(UserError, match="no file under .* differs from .*: that is no patch set; nothing written"):
        regen.regenerate(root, tree, **QUIET)
    assert _listing(root) == before


def test_expand_writes_only_into_a_new_or_empty_folder(workspace, tmp_path):
    root, _ = workspace
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "note").write_text("mine\n")
    refused = regen_cli("--root", str(root), "--expand", str(taken))
    assert refused.returncode == 2 and refused.stderr == (
        f"regen: error: {taken} is not an empty folder; --expand writes only into a new or empty one\n")
    assert _listing(taken) == {"note": b"mine\n"}
    empty = tmp_path / "empty"
    empty.mkdir()
    assert regen_cli("--root", str(root), "--expand", str(empty)).returncode == 0
    assert sorted(_listing(empty)) == sorted([*EDITED, *ADDED])


def test_expand_of_a_diff_that_does_not_fit_writes_nothing(workspace, tmp_path):
    root, _ = workspace
    diff = root / diff_name("sglang/srt/server_args.py")
    diff.write_bytes(diff.read_bytes().replace(b"+K26_PATCHSET_PROBE = 1", b"+K26_PATCHSET_PROBE = 2"))
    with pytest.raises(UserError, match="server_args.diff applied to the pinned original of sglang/srt/server_args.py "
                                        "does not give the patched_sha256 in pins.json"):
        regen.expand(root, tmp_path / "out", **QUIET)
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_usage_errors_are_one_line(workspace, tmp_path):
    root, tree = workspace
    for args, says in [([], "one of the arguments --expand --from is required"),
                       (["--expand", str(tmp_path / "x"), "--from", str(tree)], "not allowed with argument"),
                       (["--expand", str(tmp_path / "x"), "--version", "1"], "--version names a new patch set's version")]:
        proc = regen_cli("--root", str(root), *args)
        assert proc.returncode == 2 and len(proc.stderr.splitlines()) == 1 and says in proc.stderr, proc.stderr
    helped = regen_cli("--help")
    assert helped.returncode == 0 and "--expand DIR" in helped.stdout and "--from DIR" in helped.stdout


def test_a_cached_wheel_with_the_wrong_hash_is_refused(shipped_patch_set, tmp_path):
    pin = read_wheel_pin(shipped_patch_set)
    (tmp_path / pin.filename).write_bytes(b"truncated download")
    with pytest.raises(UserError, match="the pin is"):
        pinned_wheel(pin, tmp_path)


def test_the_download_asks_pip_for_the_pinned_files_interpreter_and_platform():
    assert _pip_tags("sglang-0.5.11-cp311-cp311-manylinux_2_34_x86_64.whl") == [
        "--only-binary", ":all:", "--implementation", "cp", "--python-version", "3.11",
        "--abi", "cp311", "--platform", "manylinux_2_34_x86_64"]
    assert _pip_tags("sglang-0.5.17-1-py3-none-any.whl") == [
        "--only-binary", ":all:", "--implementation", "py", "--python-version", "3",
        "--abi", "none", "--platform", "any"]
    assert _pip_tags("x-1-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl")[-4:] == [
        "--platform", "manylinux_2_17_x86_64", "--platform", "manylinux2014_x86_64"]


def test_a_pin_whose_file_pip_does_not_give_is_refused(tmp_path):
    pin = WheelPin(DEFAULT_VERSION, "sglang-0.0.0-cp311-cp311-manylinux_2_34_x86_64.whl", "0" * 64)
    with pytest.raises(UserError, match=f"not the pinned {pin.filename}"):
        pinned_wheel(pin, tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_the_shipped_pins_are_sorted_json_ending_in_a_newline(shipped_patch_set):
    text = (shipped_patch_set / PINS_FILE).read_text()
    assert text.endswith("}\n") and text == json.dumps(json.loads(text), indent=2, sort_keys=True) + "\n"
    assert sha256_file(wheel_for(shipped_patch_set)) == read_wheel_pin(shipped_patch_set).sha256

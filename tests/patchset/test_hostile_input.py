"""Hostile or damaged input, as real processes: a pins.json whose paths leave the site, a
pins.json or journal of the wrong shape, a directory where a file belongs. Each is refused in
one line that says in words what is wrong (exit 2), and nothing is written, in the site or
outside it."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from k26_ddtree.hashing import sha256_file
from k26_ddtree.patchset.journal import FORMAT, JOURNAL_NAME
from k26_ddtree.patchset.pins import PINS_FILE, diff_name
from processes import SECOND_TARGET, SERVER_ARGS, run, staged_leftovers

ADDED_TARGET = "sglang/srt/speculative/k26_probe.py"  # the synthetic patch set's added file


def _listing(root):
    """Every path under root, folders included, with the bytes of each file."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


def _one_error_line(command, code: int = 2) -> str:
    assert command.proc.returncode == code, command.text()
    lines = command.stderr.splitlines()
    assert len(lines) == 1 and "Traceback" not in command.stderr, command.text()
    assert lines[0].startswith("k26-deploy: error: "), command.text()
    return lines[0].removeprefix("k26-deploy: error: ")


# -- pins.json naming paths outside sglang/ --------------------------------------------------

@pytest.fixture
def renamed_pin(synthetic_patch_set, tmp_path):
    """renamed_pin(rel): a copy of the synthetic patch set whose pins.json names `rel` instead of
    server_args.py (its diff stays where it is: the pin is refused before any diff is read)."""
    def make(rel: str):
        root = tmp_path / "hostile-patch-set"
        shutil.copytree(synthetic_patch_set, root)
        pins = json.loads((root / PINS_FILE).read_text())
        pins["files"][rel] = pins["files"].pop(SERVER_ARGS)
        (root / PINS_FILE).write_text(json.dumps(pins, indent=2))
        return root
    return make


OUTSIDE = "../outside/evil.py"
LEAVES = "has a '..' part, so it leaves the site"


@pytest.mark.parametrize("rel, why, mode", [
    (OUTSIDE, LEAVES, []),
    (OUTSIDE, LEAVES, ["--dry-run"]),
    (OUTSIDE, LEAVES, ["--check"]),
    (OUTSIDE, LEAVES, ["--revert"]),
    ("sglang/../../outside/evil.py", LEAVES, []),
    ("{tmp}/outside/evil.py", "is absolute", []),
    ("sglang/srt/./server_args.py", "is not normalised (it has an empty or '.' part)", []),
    ("sglang//srt/server_args.py", "is not normalised (it has an empty or '.' part)", []),
    ("outside/evil.py", "is not inside sglang/", []),
    ("sglang/srt/server_args.py\n", "has a control character", []),
])
def test_a_pin_naming_a_path_outside_sglang_is_refused_before_anything_is_written(
        rel, why, mode, site, renamed_pin, tmp_path, snapshot):
    rel = rel.format(tmp=tmp_path)
    patch_set = renamed_pin(rel)
    before = _listing(site)
    refused = run(site, patch_set, *mode)
    assert _one_error_line(refused) == (f"{patch_set / PINS_FILE} is not a valid pins file: "
                                        f"the 'files' entry {ascii(rel)} {why}")
    assert _listing(site) == before  # no lock file, journal, backup or staged file either
    assert not (tmp_path / "outside").exists() and not staged_leftovers(tmp_path)


# -- pins.json and journal of the wrong shape ------------------------------------------------

def _pins(synthetic_patch_set) -> dict:
    return json.loads((synthetic_patch_set / PINS_FILE).read_text())


def _changed(edit):
    """A case: the well-formed pins.json or journal, changed in place by `edit`."""
    def case(record):
        edit(record)
        return record
    return case


@pytest.mark.parametrize("pins, why", [
    ("[]", "the top level is an array, not an object"),
    ('"pins"', "the top level is a string, not an object"),
    ("{", "it is not JSON (Expecting property name enclosed in double quotes: line 1, column 2)"),
    (b"\xff\xfe{}", "it is not UTF-8 text"),
    ("[" * 100_000, "it nests deeper than the JSON reader goes"),
    (_changed(lambda p: p.pop("wheel")), "the top level lacks the field 'wheel'"),
    (_changed(lambda p: p.update(extra=1)), "the top level has an unknown field 'extra'"),
    (_changed(lambda p: p.update(files=[])), "'files' is an array, not an object"),
    (_changed(lambda p: p["files"].update({SERVER_ARGS: "abc"})), f"files['{SERVER_ARGS}'] is a string, not an object"),
    (_changed(lambda p: p["files"][SERVER_ARGS].update(patched_sha256=5)),
     f"files['{SERVER_ARGS}'].patched_sha256 is a number, not a SHA256 (64 lowercase hex digits)"),
    (_changed(lambda p: p["files"][SERVER_ARGS].update(original_sha256="ABC")),
     f"files['{SERVER_ARGS}'].original_sha256 is 'ABC', not a SHA256 (64 lowercase hex digits) or null"),
    (_changed(lambda p: p.update(sglang_version=["0.5.11"])), "'sglang_version' is an array, not a version such as '0.5.11'"),
    (_changed(lambda p: p.update(sglang_version="0.5.11\nrm -rf /")),
     "'sglang_version' is '0.5.11\\nrm -rf /', not a version such as '0.5.11'"),
    (_changed(lambda p: p["wheel"].update(filename="../../x.whl")),
     "wheel.filename is '../../x.whl', not the file name of a wheel"),
])
def test_a_pins_file_of_the_wrong_shape_is_refused_saying_which_field(pins, why, site, synthetic_patch_set, tmp_path):
    root = tmp_path / "bad-pins"
    shutil.copytree(synthetic_patch_set, root)
    if callable(pins):
        pins = json.dumps(pins(_pins(synthetic_patch_set)))
    (root / PINS_FILE).write_bytes(pins if isinstance(pins, bytes) else pins.encode())
    before = _listing(site)
    modes = [[], ["--check"], ["--revert", "--dry-run"]] if pins == "[]" else [[]]
    for mode in modes:
        refused = run(site, root, *mode)
        assert _one_error_line(refused) == f"{root / PINS_FILE} is not a valid pins file: {why}"
    assert _listing(site) == before


def _journal(site) -> dict:
    """A journal as an apply killed before its first change leaves it; rolling it back changes nothing."""
    return {"format": FORMAT, "operation": "apply", "phase": "preparing", "directory": None, "made_dirs": [],
            "pid": 4242, "started": "2026-01-31T12:00:00Z",
            "files": [{"path": SERVER_ARGS, "role": "sglang", "old_sha256": sha256_file(site / SERVER_ARGS),
                       "new_sha256": "0" * 64, "staged": None, "undo": None}]}


def test_the_well_formed_journal_these_cases_start_from_is_rolled_back(site, synthetic_patch_set):
    (site / JOURNAL_NAME).write_text(json.dumps(_journal(site)))
    reverted = run(site, synthetic_patch_set, "--revert")
    assert reverted.proc.returncode == 0, reverted.text()
    assert reverted.stdout.startswith("found an interrupted apply (pid 4242, started 2026-01-31T12:00:00Z, "
                                      "stopped while preparing)")
    assert not (site / JOURNAL_NAME).exists()




def _first(field, value):
    return _changed(lambda j: j["files"][0].update({field: value}))


@pytest.mark.parametrize("journal, why", [
    ("[]", "the top level is an array, not an object"),
    ("{}", "the top level lacks the field 'directory'"),
    (_changed(lambda j: j.update(format="k26-ddtree-journal/9")),
     "its format is 'k26-ddtree-journal/9', not 'k26-ddtree-journal/1'"),
    (_changed(lambda j: j.update(operation="rm")), "operation is 'rm', not one of apply, revert"),
    (_changed(lambda j: j.update(phase="done")), "phase is 'done', not one of preparing, replacing, committed"),
    (_changed(lambda j: j.update(pid="4242")), "pid is '4242', not a process id"),
    (_changed(lambda j: j.update(started=7)), "started is a number, not a time such as 2026-01-31T12:00:00Z"),
    (_changed(lambda j: j.update(files={})), "files is an object, not an array"),
    (_changed(lambda j: j.update(made_dirs=["/etc"])), "made_dirs[0] '/etc' is absolute"),
    (_changed(lambda j: j.update(directory=[])), "directory is an array, not an object"),
    (_changed(lambda j: j["files"].append(7)), "files[1] is a number, not an object"),
    (_changed(lambda j: j["files"][0].pop("undo")), "files[0] lacks the field 'undo'"),
    (_first("role", "root"), "files[0].role is 'root', not one of sglang, backup, import"),
    (_first("path", "../victim.txt"), "files[0].path '../victim.txt' has a '..' part, so it leaves the site"),
    (_first("undo", "sglang//x"), "files[0].undo 'sglang//x' is not normalised (it has an empty or '.' part)"),
    (_first("path", None), "files[0].path is null, not a string"),
    (_first("old_sha256", "xyz"), "files[0].old_sha256 is 'xyz', not a SHA256 (64 lowercase hex digits) or null"),
])
def test_a_journal_of_the_wrong_shape_is_refused_saying_which_field(journal, why, site, synthetic_patch_set, snapshot):
    if callable(journal):
        journal = json.dumps(journal(_journal(site)))
    (site / JOURNAL_NAME).write_text(journal)
    before = snapshot(site)
    modes = [["--revert"], [], ["--check"], ["--dry-run"]] if journal == "[]" else [["--revert"]]
    for mode in modes:
        refused = run(site, synthetic_patch_set, *mode)
        assert _one_error_line(refused) == (f"{site / JOURNAL_NAME} is not a journal this k26-deploy understands: "
                                            f"{why}; restore the files it names by hand, then delete it")
    assert snapshot(site) == before


def test_a_journal_naming_a_file_outside_the_site_cannot_make_the_rollback_delete_it(site, synthetic_patch_set, tmp_path):
    """The rollback deletes a path whose content is the journal's new content and that was absent
    before: with an unchecked path, that is any file outside the site whose SHA256 is known."""
    victim = tmp_path / "victim.txt"
    victim.write_text("not the site's\n")
    journal = _journal(site)
    journal["files"] = [{"path": "../victim.txt", "role": "import", "old_sha256": None,
                         "new_sha256": sha256_file(victim), "staged": None, "undo": None}]
    (site / JOURNAL_NAME).write_text(json.dumps(journal))
    refused = run(site, synthetic_patch_set)
    assert "files[0].path '../victim.txt' has a '..' part" in _one_error_line(refused)
    assert victim.read_text() == "not the site's\n"


# -- something other than a regular file where a file belongs --------------------------------

def _directory(path):
    path.unlink(missing_ok=True)
    path.mkdir()
    (path / "inside.py").write_text("kept\n")


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _file_for_folder(path):
    shutil.rmtree(path.parent)
    path.parent.write_text("a file where the speculative package was\n")


@pytest.mark.parametrize("target, make, number, says", [
    (SERVER_ARGS, _directory, 1, "foreign-modified (a directory where a file belongs)"),
    (ADDED_TARGET, _directory, 3, "foreign-modified (a directory where a file belongs)"),
    (SERVER_ARGS, _fifo, 1, "foreign-modified (a FIFO where a file belongs)"),
    (SECOND_TARGET, _file_for_folder, 2,
     "foreign-modified (sglang/srt/speculative is a regular file where a folder belongs)"),
])
def test_something_other_than_a_regular_file_where_a_file_belongs_is_named(target, make, number, says, site,
                                                                           synthetic_patch_set, snapshot):
    make(site / target)
    before = snapshot(site)
    check = run(site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 2, check.text()
    assert f"  [{number}/3] {target}: {says}" in check.stdout.splitlines()
    assert check.stdout.splitlines()[-1] == "state: foreign-modified"
    refused = run(site, synthetic_patch_set)
    assert _one_error_line(refused).startswith("refusing to patch: ")
    assert f"{target} ({says})" in _one_error_line(refused)
    assert _one_error_line(refused).endswith("; nothing changed")
    assert snapshot(site) == before and not staged_leftovers(site)


# -- a diff that is not a regular file -------------------------------------------------------

@pytest.mark.parametrize("make, kind", [(_directory, "a folder"), (_fifo, "a FIFO")])
def test_a_diff_that_is_not_a_regular_file_is_refused_in_one_line(make, kind, site, synthetic_patch_set, tmp_path,
                                                                  snapshot):
    root = tmp_path / "odd-diff"
    shutil.copytree(synthetic_patch_set, root)
    diff = root / diff_name(SERVER_ARGS)
    make(diff)
    before = snapshot(site)
    for mode in (["--dry-run"], []):
        refused = run(site, root, *mode)
        assert _one_error_line(refused) == f"the diff {diff} is not a regular file ({kind})"
    assert snapshot(site) == before

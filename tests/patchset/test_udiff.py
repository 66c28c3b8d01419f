"""Unified diffs over bytes: exact round trips, GNU `patch` and `diff -u` compatibility, strict refusal."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from k26_ddtree.patchset.udiff import PatchError, apply_diff, make_diff, split_lines

LINES = [b"a\n", b"b\n", b"\n", b"\x0cform feed\n", b"crlf\r\n", b"unicode \xc3\xa9\n", b"x = 1  # comment\n"]


def _random_file(rng: random.Random) -> bytes:
    data = b"".join(rng.choice(LINES) for _ in range(rng.randint(0, 40)))
    if data and rng.random() < 0.3:
        data = data[:-1]  # no newline at the end
    return data


def _pairs(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        old = _random_file(rng) if rng.random() > 0.1 else None
        new = _random_file(rng)
        if old != new and new:
            yield old, new


def test_split_lines_breaks_only_at_newline():
    assert split_lines(b"a\x0cb\r\nc\rd\ne") == [b"a\x0cb\r\n", b"c\rd\n", b"e"]
    assert split_lines(b"") == []


def test_round_trip_forward_and_back():
    for old, new in _pairs(2000, seed=7):
        diff = make_diff(old, new, "sglang/x.py")
        assert apply_diff(old, diff) == new
        if old is not None:
            assert apply_diff(new, diff, reverse=True) == old


def test_headers_and_missing_newline_marker():
    diff = make_diff(b"one\ntwo\n", b"one\nTWO", "sglang/srt/f.py")
    assert diff == (b"--- a/sglang/srt/f.py\n+++ b/sglang/srt/f.py\n@@ -1,2 +1,2 @@\n one\n-two\n+TWO\n"
                    b"\\ No newline at end of file\n")
    assert make_diff(None, b"new\n", "sglang/n.py").startswith(b"--- /dev/null\n+++ b/sglang/n.py\n@@ -0,0 +1 @@\n")


def test_a_diff_that_does_not_fit_is_refused():
    diff = make_diff(b"a\nb\nc\n", b"a\nB\nc\n", "f.py")
    with pytest.raises(PatchError):
        apply_diff(b"a\nX\nc\n", diff)


@pytest.mark.skipif(shutil.which("patch") is None or shutil.which("diff") is None, reason="GNU patch/diff not installed")
def test_gnu_tools_agree(tmp_path):
    target = tmp_path / "pkg" / "f.py"
    target.parent.mkdir()
    for index, (old, new) in enumerate(_pairs(300, seed=11)):
        if index % 3:
            continue
        if old is None:
            target.unlink(missing_ok=True)
        else:
            target.write_bytes(old)
        ours = make_diff(old, new, "pkg/f.py")
        subprocess.run(["patch", "-p1", "-F0", "-s", "--no-backup-if-mismatch", "-d", str(tmp_path)],
                       input=ours, check=True, timeout=30)
        assert target.read_bytes() == new
        if old is not None:
            theirs = subprocess.run(["diff", "-u", "--label", "a/pkg/f.py", "--label", "b/pkg/f.py", "-", str(target)],
                                    input=old, capture_output=True, timeout=30).stdout
            assert apply_diff(old, theirs) == new

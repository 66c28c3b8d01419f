"""`k26-deploy apply` end to end as a subprocess: exit codes, one-line errors, help text."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from k26_ddtree.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]


def k26(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree.cli.main", "apply", *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


def test_apply_check_revert_exit_codes(site, synthetic_patch_set):
    common = ["--sglang-dir", str(site), "--patch-set", str(synthetic_patch_set)]
    assert k26(*common, "--check").returncode == 1

    dry = k26(*common, "--dry-run")
    assert dry.returncode == 0 and "dry run: would patch 3 file(s)" in dry.stdout

    done = k26(*common)
    assert done.returncode == 0, done.stderr
    assert "[1/3] sglang/srt/server_args.py: pristine" in done.stdout
    assert "applied: 3 file(s) patched" in done.stdout

    check = k26(*common, "--check")
    assert check.returncode == 0 and "state: applied" in check.stdout

    again = k26(*common)
    assert again.returncode == 0 and "already applied" in again.stdout

    reverted = k26(*common, "--revert")
    assert reverted.returncode == 0 and "reverted: 3 file(s) restored" in reverted.stdout
    assert k26(*common, "--check").returncode == 1

    target = site / "sglang/srt/server_args.py"
    target.write_bytes(target.read_bytes() + b"# local edit\n")
    refused = k26(*common)
    assert refused.returncode == 2
    assert refused.stderr.startswith("k26-deploy: error: refusing to patch: sglang/srt/server_args.py (foreign-modified")
    assert "Traceback" not in refused.stderr
    assert k26(*common, "--check").returncode == 2


def test_user_mistakes_are_one_line(tmp_path):
    missing = k26("--sglang-dir", str(tmp_path), "--check")
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines() == [
        f"k26-deploy: error: no sglang package at {tmp_path} (give the sglang package dir or the dir that holds it)"]
    both = k26("--check", "--revert")
    assert both.returncode == 2 and "not allowed with" in both.stderr
    empty = k26("--sglang-dir", "", "--check")  # an unset shell variable must not mean the current folder
    assert empty.returncode == 2 and "Traceback" not in empty.stderr
    assert "argument --sglang-dir: an empty path names no directory or file" in empty.stderr


def test_help_documents_the_check_exit_codes():
    shown = k26("--help").stdout
    assert "--check exit codes:" in shown
    for line in ("0  applied", "1  not applied", "2  apply would refuse", "state: interrupted"):
        assert line in shown
    assert "--lock-timeout SECONDS" in shown and "<site>/.k26-ddtree.lock" in shown
    assert "<site>/.k26-ddtree.journal" in shown
    assert "130 / 143 when stopped by SIGINT /\nSIGTERM" in shown and "75 when the lock stayed busy" in shown


@pytest.mark.parametrize("seconds", ["1e308", "inf", "nan", "3600.5", "-1", "soon"])
def test_a_lock_timeout_past_an_hour_or_not_a_number_is_one_line(seconds):
    refused = k26("--lock-timeout", seconds)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"k26-deploy: error: apply: argument --lock-timeout: not a number of seconds from 0 to 3600: {seconds!r} "
        "(see `k26-deploy apply --help`)"]


def test_a_lock_timeout_of_up_to_an_hour_is_taken():
    for seconds, value in (("0", 0.0), ("2.5", 2.5), ("3600", 3600.0)):
        assert build_parser().parse_args(["apply", "--lock-timeout", seconds]).lock_timeout == value

"""`k26-deploy reconfigure` and the schedule text under input that once deployed something else than
the command line said: an explicit --set losing to a schedule, an empty value, schedules reaching the
unit as typed, and files that are no regular file or far too large."""

from __future__ import annotations

import json
import os

import pytest
from deploy_helpers import k26, one_line_error

from k26_ddtree.core import schedule


def _tune_file(tmp_path, schedule_text: str = "1:8/4,16:0", spine: bool = True) -> str:
    path = tmp_path / "tuned.json"
    path.write_text(json.dumps({"schema": "k26-ddtree-tune/1", "schedule": schedule_text, "spine": spine}))
    return str(path)


@pytest.mark.parametrize("args, expected", [
    (["--schedule-file", "FILE", "--set", "speculative.spine=false"],
     "--set speculative.spine=false conflicts with --schedule-file, which sets speculative.spine too"),
    (["--schedule", "1:8/4", "--set", "speculative.algorithm=DFLASH"],
     "--set speculative.algorithm=DFLASH conflicts with --schedule, which sets speculative.algorithm too"),
    (["--budget", "8", "--set", "speculative.budget=16"], "conflicts with --budget/--topk"),
    (["--set", "speculative.schedule="], "speculative.schedule: the value is empty; write null to unset the key"),
])
def test_an_explicit_set_that_another_flag_overrides_is_refused(tmp_path, args, expected):
    args = [_tune_file(tmp_path) if a == "FILE" else a for a in args]
    assert expected in one_line_error(k26("reconfigure", "--profile", "pcie-ep8", "--allow-missing-model", *args,
                                          "--dry-run"))


@pytest.mark.parametrize("text, expected", [
    ("1:8/4,999999999999999999:0", "starts above 65536 requests"),
    ("1:1/8", "topk 8 above budget 1"),
])
def test_a_schedule_no_server_serves_as_written_is_refused(text, expected):
    with pytest.raises(schedule.ScheduleError, match=expected):
        schedule.parse(text)
    assert expected in one_line_error(k26("reconfigure", "--profile", "pcie-ep8", "--allow-missing-model",
                                          "--schedule", text, "--dry-run"))


@pytest.mark.parametrize("typed", [" 1 : 8 / 4 , 4 : 0 ", "01:08/04,04:0"])
def test_a_schedule_reaches_the_unit_in_one_spelling(typed):
    done = k26("reconfigure", "--profile", "pcie-ep8", "--allow-missing-model", "--schedule", typed, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert "--speculative-ddtree-budget-schedule 1:8/4,4:0" in done.stdout
    assert typed.strip() not in done.stdout


def test_dry_run_from_a_profile_needs_no_systemd(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()  # a PATH without systemctl
    done = k26("reconfigure", "--profile", "pcie-ep8", "--allow-missing-model", "--budget", "16", "--dry-run",
               env={"PATH": str(bin_dir)})
    assert done.returncode == 0, done.stderr
    assert "--speculative-ddtree-budget 16" in done.stdout and "is not installed here" in done.stdout


def test_a_schedule_file_that_is_no_regular_file_or_too_large_is_refused(tmp_path):
    link = tmp_path / "zero.json"
    link.symlink_to("/dev/zero")
    assert "is not a regular file (a character device)" in one_line_error(
        k26("reconfigure", "--schedule-file", str(link), "--dry-run"))
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    assert "is not a regular file (a FIFO)" in one_line_error(
        k26("reconfigure", "--schedule-file", str(fifo), "--dry-run"))
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(17 << 20)
    assert "more than the 16 MB read at most" in one_line_error(
        k26("reconfigure", "--schedule-file", str(big), "--dry-run"))


def test_a_schedule_file_naming_a_key_twice_is_refused(tmp_path):
    path = tmp_path / "tuned.json"
    path.write_text('{"schema": "k26-ddtree-tune/1", "schedule": "1:8/4", "spine": true, "spine": false}')
    assert "names the key 'spine' twice" in one_line_error(k26("reconfigure", "--schedule-file", str(path),
                                                               "--dry-run"))

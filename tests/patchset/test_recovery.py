"""SIGKILL mid-transaction (a real process, paused at a checkpoint, then killed): the next
command finds the journal, names it, and leaves a whole tree; stray staged files are found too."""

from __future__ import annotations

import signal

import pytest

from k26_ddtree.errors import UserError
from k26_ddtree.patchset import apply
from k26_ddtree.patchset.journal import JOURNAL_NAME
from k26_ddtree.patchset.pins import DEFAULT_VERSION
from processes import SECOND_TARGET, Command, run, staged_leftovers, which_whole_state, whole_states


@pytest.fixture
def states(make_site, synthetic_patch_set, snapshot, tmp_path):
    return whole_states(make_site, synthetic_patch_set, snapshot, tmp_path / "reference")


def _kill_at(site, patch_set, args, doing, tmp_path) -> Command:
    command = Command(site, patch_set, *args, pause=tmp_path / "pause", hold=doing)
    command.wait_paused(doing)
    command.proc.send_signal(signal.SIGKILL)
    assert command.wait() == -signal.SIGKILL
    return command


@pytest.mark.parametrize("then", ["apply", "revert"])
@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_sigkill_between_two_replaces_is_named_and_rolled_back_by_the_next_command(
        operation, then, site, synthetic_patch_set, states, snapshot, tmp_path):
    if operation == "revert":
        apply.apply(site, synthetic_patch_set, out=lambda line: None)
    killed = _kill_at(site, synthetic_patch_set, ["--revert"] if operation == "revert" else [],
                      f"replacing {SECOND_TARGET}", tmp_path)
    assert which_whole_state(site, states, snapshot) is None  # one file swapped, the other not
    assert (site / JOURNAL_NAME).is_file() and staged_leftovers(site)

    left = snapshot(site)
    check = run(site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 1, check.text()
    assert (f"interrupted {operation} (pid {killed.proc.pid}, started " in check.stdout
            and "stopped while replacing) found: " in check.stdout)
    assert "stray staged" not in check.stdout  # the journal names its staged files
    assert check.stdout.splitlines()[-1] == "state: interrupted"
    assert snapshot(site) == left  # --check only reports

    after = run(site, synthetic_patch_set, *([] if then == "apply" else ["--revert"]))
    assert after.proc.returncode == 0, after.text()
    first = after.stdout.splitlines()[0]
    assert first.startswith(f"found an interrupted {operation} (pid {killed.proc.pid}, ")
    assert first.endswith("rolled it back; every path it touched hashes as before it")
    assert which_whole_state(site, states, snapshot) == ("applied" if then == "apply" else "pristine")
    assert not staged_leftovers(site) and not (site / JOURNAL_NAME).exists()


def test_sigkill_while_staging_is_rolled_back_with_the_files_it_had_not_recorded(
        site, synthetic_patch_set, states, snapshot, tmp_path):
    killed = _kill_at(site, synthetic_patch_set, [], f"staging {SECOND_TARGET}", tmp_path)
    assert staged_leftovers(site)  # the backups and the first file, staged but not yet in the journal
    after = run(site, synthetic_patch_set, "--revert")
    assert after.proc.returncode == 0, after.text()
    first = after.stdout.splitlines()[0]
    assert first.startswith(f"found an interrupted apply (pid {killed.proc.pid}, ")
    assert "stopped while preparing" in first and "staged file(s) it had not recorded yet" in first
    assert which_whole_state(site, states, snapshot) == "pristine"
    assert not staged_leftovers(site) and not (site / apply.BACKUP_DIR).exists()


def test_sigkill_after_the_commit_has_its_clean_up_finished(site, synthetic_patch_set, states, snapshot, tmp_path):
    killed = _kill_at(site, synthetic_patch_set, [], "cleaning up", tmp_path)
    assert staged_leftovers(site)  # the undo copies
    check = run(site, synthetic_patch_set, "--check")
    assert check.proc.returncode == 1
    assert "stopped after committing, before its clean-up) found" in check.stdout
    after = run(site, synthetic_patch_set)
    assert after.proc.returncode == 0, after.text()
    assert after.stdout.splitlines()[0].startswith(f"found an interrupted apply (pid {killed.proc.pid}, ")
    assert "its change was complete: finished its clean-up" in after.stdout and "already applied" in after.stdout
    assert which_whole_state(site, states, snapshot) == "applied"
    assert not staged_leftovers(site) and not (site / JOURNAL_NAME).exists()


def test_stray_staged_files_without_a_journal_are_reported_then_deleted(site, synthetic_patch_set):
    apply.apply(site, synthetic_patch_set, out=lambda line: None)
    strays = [site / "sglang/srt/.server_args.py.ab12cd34.k26-tmp",
              site / apply.BACKUP_DIR / f"sglang-{DEFAULT_VERSION}/sglang/srt/.server_args.py.ef56gh78.k26-tmp"]
    for stray in strays:
        stray.write_bytes(b"half of something")
    scratch = site / ".k26_ddtree.ij90kl12.k26-tmp"
    (scratch / "new").mkdir(parents=True)
    lines: list[str] = []
    assert apply.check(site, synthetic_patch_set, out=lines.append) == 1
    reported = next(line for line in lines if line.startswith("stray staged file(s) from an interrupted run: "))
    assert all(path.relative_to(site).as_posix() in reported for path in [*strays, scratch])
    assert lines[-1] == "state: applied, but stray staged files are left (run k26-deploy apply to delete them)"
    assert all(stray.exists() for stray in strays)

    lines = []
    assert apply.apply(site, synthetic_patch_set, out=lines.append) == 0
    assert lines[0].startswith("deleted 3 stray staged file(s) left by an interrupted run: ")
    assert not staged_leftovers(site)
    assert apply.check(site, synthetic_patch_set, out=lambda line: None) == 0


def test_an_unreadable_journal_is_one_clear_error(site, synthetic_patch_set):
    (site / JOURNAL_NAME).write_text('{"format": "k26-ddtree-journal/1", "operation": "ap')
    for command in (apply.check, apply.apply, apply.revert):
        with pytest.raises(UserError, match=r"cannot read the transaction journal .*; restore the files it names"):
            command(site, synthetic_patch_set, out=lambda line: None)

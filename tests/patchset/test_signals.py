"""SIGINT and SIGTERM delivered to a real `apply` / `apply --revert` process while it is paused
inside its transaction: it rolls back completely, says so truly, and exits 128 + the signal."""

from __future__ import annotations

import signal

import pytest

from k26_ddtree.patchset import apply
from k26_ddtree.patchset.journal import JOURNAL_NAME
from processes import SECOND_TARGET, SERVER_ARGS, Command, run, staged_leftovers, which_whole_state, whole_states


@pytest.fixture
def states(make_site, synthetic_patch_set, snapshot, tmp_path):
    return whole_states(make_site, synthetic_patch_set, snapshot, tmp_path / "reference")


def _interrupt(site, patch_set, args, doing, signum, tmp_path) -> Command:
    command = Command(site, patch_set, *args, pause=tmp_path / "pause", hold=doing)
    command.wait_paused(doing)
    command.proc.send_signal(signum)
    command.wait()
    return command


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_a_signal_between_two_replaces_rolls_back_and_exits_128_plus_it(
        operation, signum, site, synthetic_patch_set, states, snapshot, tmp_path):
    if operation == "revert":
        apply.apply(site, synthetic_patch_set, out=lambda line: None)
    before = "applied" if operation == "revert" else "pristine"
    args = ["--revert"] if operation == "revert" else []
    command = _interrupt(site, synthetic_patch_set, args, f"replacing {SECOND_TARGET}", signum, tmp_path)

    assert command.proc.returncode == 128 + signum, command.text()
    assert f"  replaced {SERVER_ARGS}" in command.stdout  # the first file had been swapped in
    assert command.stderr.splitlines() == [
        f"k26-deploy: error: {operation} interrupted by {signal.Signals(signum).name} before replacing {SECOND_TARGET}; "
        "rolled back, nothing changed (every path it touched hashes as before)"]
    assert which_whole_state(site, states, snapshot) == before
    assert not staged_leftovers(site) and not (site / JOURNAL_NAME).exists()
    check = run(site, synthetic_patch_set, "--check")
    assert f"state: {before}" in check.stdout and check.proc.returncode == (0 if before == "applied" else 1)


@pytest.mark.parametrize("doing", [f"staging {SECOND_TARGET}", "adding k26_ddtree",
                                   "adding sglang/srt/speculative/k26_probe.py", "committing"])
def test_sigterm_at_any_checkpoint_of_apply_rolls_back(doing, site, synthetic_patch_set, states, snapshot, tmp_path):
    """While staging, once the backups are in, before the last (added) file, after every swap."""
    command = _interrupt(site, synthetic_patch_set, [], doing, signal.SIGTERM, tmp_path)
    assert command.proc.returncode == 143, command.text()
    when = f"while {doing}" if doing.startswith("staging") else f"before {doing}"
    assert f"apply interrupted by SIGTERM {when}; rolled back, nothing changed" in command.stderr
    assert which_whole_state(site, states, snapshot) == "pristine"
    assert not staged_leftovers(site) and not (site / JOURNAL_NAME).exists()


def test_a_signal_while_waiting_for_the_lock_changes_nothing(site, synthetic_patch_set, states, snapshot, tmp_path):
    holder = Command(site, synthetic_patch_set, pause=tmp_path / "pause", hold=f"replacing {SERVER_ARGS}")
    holder.wait_paused(f"replacing {SERVER_ARGS}")
    waiter = Command(site, synthetic_patch_set, "--revert")
    waiter.wait_for_output("waiting for the lock")
    waiter.proc.send_signal(signal.SIGINT)
    assert waiter.wait() == 130
    assert waiter.stderr.splitlines() == ["k26-deploy: error: interrupted by SIGINT; apply --revert changed nothing"]
    holder.release(f"replacing {SERVER_ARGS}")
    assert holder.wait() == 0, holder.text()
    assert which_whole_state(site, states, snapshot) == "applied"


def test_a_signal_after_the_commit_keeps_the_result_and_says_so(site, synthetic_patch_set, states, snapshot, tmp_path):
    command = _interrupt(site, synthetic_patch_set, [], "cleaning up", signal.SIGTERM, tmp_path)
    assert command.proc.returncode == 143
    assert "applied: 3 file(s) patched" in command.stdout
    assert command.stderr.splitlines() == ["k26-deploy: error: SIGTERM arrived as apply finished; its result above stands"]
    assert which_whole_state(site, states, snapshot) == "applied"
    assert not staged_leftovers(site)

"""One command at a time per site, between real processes: a second one waits, saying for whom,
or gives up in one line; apply, revert and check racing always leave (and see) a whole tree."""

from __future__ import annotations

import fcntl
import os

import pytest

from k26_ddtree.patchset import apply
from k26_ddtree.patchset.lock import BUSY_EXIT, LOCK_NAME
from processes import SERVER_ARGS, Command, run, staged_leftovers, which_whole_state, whole_states

HELD_AT = f"replacing {SERVER_ARGS}"


@pytest.fixture
def states(make_site, synthetic_patch_set, snapshot, tmp_path):
    return whole_states(make_site, synthetic_patch_set, snapshot, tmp_path / "reference")


@pytest.fixture
def holder(site, synthetic_patch_set, tmp_path):
    """An apply paused inside its transaction, holding the lock; released and awaited afterwards."""
    command = Command(site, synthetic_patch_set, pause=tmp_path / "pause", hold=HELD_AT)
    command.wait_paused(HELD_AT)
    yield command
    if command.hold_file(HELD_AT).exists():
        command.release(HELD_AT)
    command.wait()


def test_apply_waits_while_another_process_holds_the_lock(site, synthetic_patch_set, states, snapshot):
    """Whoever holds the flock (here the test process, as another k26-deploy would) keeps apply out."""
    with open(site / LOCK_NAME, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(f"pid {os.getpid()} (apply --revert)\n")
        held.flush()
        waiter = Command(site, synthetic_patch_set, "--lock-timeout", "60")
        waiter.wait_for_output(f"waiting for the lock on {site} held by pid {os.getpid()} (apply --revert), up to 60 s\n")
        assert which_whole_state(site, states, snapshot) == "pristine"
    assert waiter.wait() == 0, waiter.text()
    assert which_whole_state(site, states, snapshot) == "applied"


def test_a_second_command_waits_for_the_lock_saying_for_whom(holder, site, synthetic_patch_set, states, snapshot):
    waiter = Command(site, synthetic_patch_set, "--revert", "--lock-timeout", "60")
    waiter.wait_for_output(f"waiting for the lock on {site} held by pid {holder.proc.pid} (apply), up to 60 s\n")
    assert waiter.proc.poll() is None
    holder.release(HELD_AT)
    assert holder.wait() == 0, holder.text()
    assert waiter.wait() == 0, waiter.text()
    assert "reverted: 3 file(s) restored" in waiter.stdout  # it ran on the whole applied tree
    assert which_whole_state(site, states, snapshot) == "pristine"


@pytest.mark.parametrize("args, message", [
    (["--check", "--lock-timeout", "0"], "the lock on {site} is held by pid {pid} (apply); nothing done (--lock-timeout 0)"),
    (["--revert", "--lock-timeout", "0.3"], "the lock on {site} is still held by pid {pid} (apply) after 0.3 s; "
                                            "nothing done (retry, or give a longer --lock-timeout)"),
])
def test_a_lock_busy_past_the_timeout_is_refused_in_one_line(args, message, holder, site, synthetic_patch_set,
                                                              states, snapshot):
    refused = run(site, synthetic_patch_set, *args)
    assert refused.proc.returncode == BUSY_EXIT
    assert refused.stderr.splitlines() == ["k26-deploy: error: " + message.format(site=site, pid=holder.proc.pid)]
    holder.release(HELD_AT)
    assert holder.wait() == 0, holder.text()
    assert which_whole_state(site, states, snapshot) == "applied"


@pytest.mark.parametrize("trial", range(8))
def test_apply_revert_and_check_racing_always_leave_a_whole_tree(trial, site, synthetic_patch_set, states, snapshot):
    if trial % 2:
        apply.apply(site, synthetic_patch_set, out=lambda line: None)
    modes = [[], ["--revert"], ["--check"]]
    modes = modes[trial % 3:] + modes[:trial % 3]
    racing = [Command(site, synthetic_patch_set, *mode) for mode in modes]
    for command in racing:
        command.wait()
    for mode, command in zip(modes, racing):
        if mode == ["--check"]:
            assert command.proc.returncode in (0, 1), command.text()
            assert command.stdout.splitlines()[-1] in ("state: applied", "state: pristine")
        else:
            assert command.proc.returncode == 0, command.text()
    assert which_whole_state(site, states, snapshot) in ("applied", "pristine")  # backups included
    assert not staged_leftovers(site)

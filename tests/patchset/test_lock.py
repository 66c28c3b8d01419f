"""One writing command at a time per site, between real processes: a second one waits, saying
for whom, or gives up in one line; apply, revert and check racing always leave (and see) a whole
tree; --check and --dry-run share the lock and create nothing."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time

import pytest

from k26_ddtree.patchset import apply
from k26_ddtree.patchset.lock import BUSY_EXIT, LOCK_NAME
from processes import SERVER_ARGS, Command, run, staged_leftovers, which_whole_state, whole_states

HELD_AT = f"replacing {SERVER_ARGS}"
UNNAMED = "another process (not a k26-deploy apply we can name)"


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


def _everything(root):
    """Every path under root, folders included, with each file's bytes (the lock file too)."""
    return {p.relative_to(root).as_posix(): None if p.is_dir() else p.read_bytes() for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("applied", [False, True])
@pytest.mark.parametrize("mode", [["--check"], ["--dry-run"], ["--revert", "--dry-run"]])
def test_read_only_commands_create_nothing_not_even_the_lock_file(mode, applied, site, synthetic_patch_set):
    if applied:
        apply.apply(site, synthetic_patch_set, out=lambda line: None)
        (site / LOCK_NAME).unlink()  # as on a site patched by hand, or whose lock file was cleaned away
    before = _everything(site)
    command = run(site, synthetic_patch_set, *mode)
    assert command.proc.returncode in (0, 1), command.text()
    assert _everything(site) == before


def test_read_only_commands_share_the_lock_and_still_keep_writers_out(site, synthetic_patch_set, states, snapshot):
    (site / LOCK_NAME).touch()
    with open(site / LOCK_NAME) as reader:
        fcntl.flock(reader, fcntl.LOCK_SH)  # as a --check in progress holds it
        check = run(site, synthetic_patch_set, "--check", "--lock-timeout", "0")
        assert check.proc.returncode == 1, check.text()
        assert check.stdout.splitlines()[-1] == "state: pristine"
        refused = run(site, synthetic_patch_set, "--lock-timeout", "0")
    assert refused.proc.returncode == BUSY_EXIT
    assert refused.stderr.splitlines() == [
        f"k26-deploy: error: the lock on {site} is held by {UNNAMED}; nothing done (--lock-timeout 0)"]
    assert which_whole_state(site, states, snapshot) == "pristine"


def test_a_writer_starting_during_an_unlocked_read_makes_it_read_again_under_the_lock(site, synthetic_patch_set,
                                                                                      monkeypatch):
    """No lock file: check reads unlocked; an apply that creates the lock file and patches the
    tree while that read is under way makes its result void, so it is read again, locked."""
    lines = []
    real_inspect = apply.inspect

    def writer_meanwhile(installation, patch_set):
        status = real_inspect(installation, patch_set)  # the pristine tree, as it was when read
        if not (site / LOCK_NAME).exists():
            apply.apply(site, synthetic_patch_set, out=lambda line: None)
        return status

    monkeypatch.setattr(apply, "inspect", writer_meanwhile)
    assert apply.check(site, synthetic_patch_set, out=lines.append) == 0
    assert lines[-1] == "state: applied"
    assert not any("pristine" in line for line in lines)  # the torn read's output was thrown away


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.parametrize("text", ["", "pid {dead} (apply)\n", "somebody\nelse (apply)\n", "pid 1 (apply --check)\n"])
def test_a_holder_that_did_not_name_itself_alive_is_called_another_process(text, site, synthetic_patch_set):
    """Only a live writer's "pid N (apply)" names the holder: an empty file (a reader, or a plain
    flock), a killed writer's leftover, or anything else written there does not."""
    with open(site / LOCK_NAME, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write(text.format(dead=_dead_pid()))
        held.flush()
        refused = run(site, synthetic_patch_set, "--check", "--lock-timeout", "0.2")
    assert refused.proc.returncode == BUSY_EXIT
    assert refused.stdout.splitlines()[-1] == f"waiting for the lock on {site} held by {UNNAMED}, up to 0.2 s"
    assert refused.stderr.splitlines() == [f"k26-deploy: error: the lock on {site} is still held by {UNNAMED} after 0.2 s; "
                                           "nothing done (retry, or give a longer --lock-timeout)"]


@pytest.mark.skipif(shutil.which("flock") is None, reason="util-linux flock is not installed")
def test_a_plain_flock_holding_the_lock_is_called_another_process(site, synthetic_patch_set):
    (site / LOCK_NAME).touch()
    holder = subprocess.Popen(["flock", "-x", str(site / LOCK_NAME), "sleep", "100"])
    try:
        with open(site / LOCK_NAME) as probe:
            while True:  # until flock has it
                try:
                    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    fcntl.flock(probe, fcntl.LOCK_UN)
                    time.sleep(0.02)
                except BlockingIOError:
                    break
        refused = run(site, synthetic_patch_set, "--lock-timeout", "0.3")
    finally:
        holder.kill()
        holder.wait()
    assert refused.proc.returncode == BUSY_EXIT
    assert f"waiting for the lock on {site} held by {UNNAMED}, up to 0.3 s" in refused.stdout.splitlines()
    assert refused.stderr.splitlines() == [f"k26-deploy: error: the lock on {site} is still held by {UNNAMED} after 0.3 s; "
                                           "nothing done (retry, or give a longer --lock-timeout)"]

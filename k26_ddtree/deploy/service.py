"""Install the unit, and retune it with `reconfigure`: restart, prove the NEW process ready, or roll back.

The last-good unit is the last unit text seen serving: saved when the running
service is ready before a change, and after a change proves itself. A failed
change puts it back, restarts it, and waits for it, so the box is never left
without a working server when one was working before.
"""

from __future__ import annotations

import contextlib
import difflib
import fcntl
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from k26_ddtree.deploy import readiness, systemd
from k26_ddtree.deploy.envfile import api_key_for, check_env_file
from k26_ddtree.deploy.schema import Profile
from k26_ddtree.deploy.units import PROFILE_MARK, local_url, profile_from_unit, render_service, validate
from k26_ddtree import atomic
from k26_ddtree.errors import UserError

DEFAULT_STATE_DIR = Path("/var/lib/k26-ddtree")
# Beyond the unit's own TimeoutStartSec: time for systemd to stop the old process.
_RESTART_SLACK_SEC = 90

Say = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    ok: bool
    pid: int
    detail: str


def state_dir(given: str | None) -> Path:
    if given == "":
        raise UserError("--state-dir is empty: give a directory, or leave --state-dir out")
    return Path(given or os.environ.get("K26_STATE_DIR") or DEFAULT_STATE_DIR)


def last_good_path(states: Path, unit: str) -> Path:
    return states / f"{systemd.unit_file_name(unit)}.last-good"


def check_model_dirs(profile: Profile, allow_missing: bool) -> None:
    if allow_missing:
        return
    from k26_ddtree.fetch.modeldir import model_dir_problem

    for key in ("model", "drafter"):
        path = Path(getattr(profile, key))
        problem = (f"{path} is a file, not a model directory" if path.exists() and not path.is_dir()
                   else model_dir_problem(path))
        if problem:
            raise UserError(
                f"profile {profile.name}: {key}: {problem} "
                "(--allow-missing-model renders anyway, e.g. on a machine without the weights)"
            )


def installed_unit(unit: str) -> Path:
    path = systemd.installed_unit_path(unit)
    if path is None:
        raise UserError(f"{unit} is not installed; install it first: k26-deploy install --profile PROFILE")
    return path


def install(profile: Profile, unit: str, unit_dir: Path, root: Path | None, start: bool, enable: bool,
            states: Path, say: Say) -> int:
    if root is None:
        # Before anything else: a unit written where no systemd will ever load it is a half-done install.
        systemd.require_systemd()
    check_env_file(profile, root)
    text = render_service(profile, unit)
    validate(text, unit)
    target = (root / unit_dir.relative_to("/") if root else unit_dir) / systemd.unit_file_name(unit)
    if root:
        atomic.write_text(target, text)
        say(f"wrote {target} ({profile.summary()})")
        say("--root given: no daemon-reload; the unit takes effect when that root boots")
        return 0
    _put_unit(target, text)
    say(f"wrote {target} ({profile.summary()})")
    running = systemd.main_pid(unit)
    if enable:
        systemd.systemctl("enable", systemd.unit_file_name(unit))
        say(f"enabled {unit} at boot")
    if not start:
        if running:
            say(f"{unit} still runs the previous unit (pid {running}); `systemctl restart {unit}` applies this one")
        else:
            say(f"next: systemctl start {unit}   (returns once the server answers /health_generate)")
        return 0
    with exclusive(states, unit):
        outcome = restart_and_wait(unit, profile, say)
    if not outcome.ok:
        raise UserError(f"{unit} did not become ready: {outcome.detail}", code=1)
    atomic.write_text(last_good_path(states, unit), text)
    say(f"{unit} ready: pid {outcome.pid}, {local_url(profile)}")
    return 0


def reconfigure(new: Profile, unit: str, states: Path, dry_run: bool, say: Say) -> int:
    if dry_run and _installed_or_none(unit) is None:
        # A dry run shows the unit a profile makes even where none is installed (or no systemd runs).
        check_env_file(new)
        text = render_service(new, unit)
        validate(text, unit)
        print(text, end="")
        print(f"# {unit} is not installed here: nothing to compare against")
        return 0
    unit_path = installed_unit(unit)
    current = unit_path.read_text(encoding="utf-8")
    check_env_file(new)
    text = render_service(new, unit)
    validate(text, unit)
    if dry_run:
        print(text, end="")
        diff = difflib.unified_diff(
            _readable(current), _readable(text), fromfile=str(unit_path), tofile=f"{unit_path} (new)",
        )
        print("".join(diff) or f"# no change against {unit_path}", end="")
        return 0
    if text == current:
        say(f"{unit} already runs {new.summary()}; nothing to change")
        return 0
    with exclusive(states, unit):
        return _switch(new, unit, unit_path, current, text, last_good_path(states, unit), say)


def _installed_or_none(unit: str) -> Path | None:
    """The installed unit's file; None where it is not installed or no systemd answers."""
    try:
        return systemd.installed_unit_path(unit)
    except UserError:
        return None


def _switch(new: Profile, unit: str, unit_path: Path, current: str, text: str, last_good: Path, say: Say) -> int:
    old = profile_from_unit(current, str(unit_path))
    if readiness.probe(systemd.main_pid(unit), local_url(old)).ready:
        atomic.write_text(last_good, current)
    rollback_text = last_good.read_text(encoding="utf-8") if last_good.is_file() else current

    say(f"{unit}: switching to {new.summary()}")
    _put_unit(unit_path, text)
    try:
        outcome = restart_and_wait(unit, new, say)
    except UserError as err:  # e.g. a stop that outlived its bound: still roll back
        outcome = Outcome(False, 0, str(err))
    if outcome.ok:
        atomic.write_text(last_good, text)
        say(f"{unit} reconfigured: {new.summary()}; ready, pid {outcome.pid}")
        return 0

    say(f"{unit}: {new.summary()} failed: {outcome.detail}; rolling back")
    good = profile_from_unit(rollback_text, str(last_good))
    _put_unit(unit_path, rollback_text)
    back = restart_and_wait(unit, good, say)
    state = f"ready again, pid {back.pid}" if back.ok else f"NOT ready either: {back.detail}"
    raise UserError(
        f"reconfigure to {new.summary()} failed ({outcome.detail}); rolled back to {good.summary()}: {state}",
        code=1,
    )


def _put_unit(path: Path, text: str) -> None:
    """Write the unit whole and daemon-reload; when the reload fails, the file is put back as it was first."""
    try:
        before = path.read_bytes()
    except FileNotFoundError:
        before = None
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror or err}") from None
    atomic.write_text(path, text)
    try:
        systemd.systemctl("daemon-reload")
    except UserError as err:
        if before is None:
            path.unlink(missing_ok=True)
            undone = f"removed {path} again"
        else:
            atomic.write_bytes(path, before)
            undone = f"put the previous {path} back"
        raise UserError(f"{str(err).rstrip('.')}; {undone}") from None


def _readable(unit_text: str) -> list[str]:
    """The unit's lines without the embedded profile (one long JSON line; the summary comment shows the change)."""
    return [line for line in unit_text.splitlines(keepends=True) if not line.startswith(PROFILE_MARK)]


@contextlib.contextmanager
def exclusive(states: Path, unit: str):
    """One restart of a unit at a time: a second reconfigure would fight over the last-good copy."""
    states.mkdir(parents=True, exist_ok=True)
    with open(states / f".{systemd.unit_file_name(unit)}.lock", "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another k26-deploy is restarting {unit} right now; wait for it to finish") from None
        yield


def restart_and_wait(unit: str, profile: Profile, say: Say, report_every: float = 10.0) -> Outcome:
    """Restart `unit` and wait, bounded, until a NEW main PID is ready and answers a smoke generate.

    Stop first and wait for it: then no process of the old invocation is left
    to answer, and no automatic restart of a failed start is pending. Each start
    gets a fresh InvocationID, so a second one appearing while we wait means
    systemd restarted a start that failed.
    """
    service = profile.service
    name = systemd.unit_file_name(unit)
    timeout = service.gpu_free_timeout_sec + service.ready_timeout_sec + _RESTART_SLACK_SEC
    url = local_url(profile)
    before = systemd.show(unit, "MainPID", "InvocationID")
    if before["MainPID"] not in ("", "0"):
        say(f"stopping {unit} (pid {before['MainPID']}), at most {service.timeout_stop_sec} s")
    systemd.systemctl("stop", name, timeout=service.timeout_stop_sec + _RESTART_SLACK_SEC)
    # A start-limit hit or an earlier failure would make systemd refuse the start.
    systemd.systemctl("reset-failed", name, check=False)
    systemd.systemctl("start", "--no-block", name)
    ours = None
    start = time.monotonic()
    last_report = 0.0
    while True:
        elapsed = time.monotonic() - start
        st = systemd.show(unit, "ActiveState", "SubState", "MainPID", "Result", "InvocationID")
        pid = int(st["MainPID"]) if st["MainPID"].isdigit() else 0
        if ours is None and st["InvocationID"] not in ("", before["InvocationID"]):
            ours = st["InvocationID"]
        failed = st["ActiveState"] == "failed" or st["SubState"] == "auto-restart"
        if failed or (ours is not None and st["InvocationID"] != ours):
            return Outcome(False, pid, f"the unit failed to start (result {st['Result']}); see journalctl -u {unit}")
        detail = f"{st['ActiveState']}/{st['SubState']}"
        if ours is not None and pid and st["MainPID"] != before["MainPID"]:
            look = readiness.probe(pid, url)
            detail += f", {look.detail}"
            if look.ready and st["ActiveState"] == "active":
                # Ranks >= 1 of a multi-node server answer health checks only; node 0 generates.
                serves = profile.parallel.node_rank == 0
                problem = readiness.smoke_generate(url, api_key_for(profile)) if serves else None
                if problem:
                    return Outcome(False, pid, problem)
                return Outcome(True, pid, look.detail)
        if elapsed >= timeout:
            return Outcome(False, pid, f"not ready after {timeout} s ({detail})")
        if elapsed - last_report >= report_every:
            say(f"waiting for {unit} [{elapsed:.0f}/{timeout} s]: {detail}")
            last_report = elapsed
        time.sleep(1.0)

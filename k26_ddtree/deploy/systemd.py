"""A thin, bounded systemctl: every call has a timeout and failures become one-line UserErrors."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from k26_ddtree.errors import UserError

SYSTEMCTL_TIMEOUT_SEC = 120
# systemd creates this at boot when it is PID 1; systemd's own sd_booted() looks for exactly this.
BOOTED_MARK = Path("/run/systemd/system")
# systemd's own rule for unit names; anything else (a '/', a space) would also name a path outside the unit dir.
_UNIT_NAME = re.compile(r"[A-Za-z0-9:_.\\@-]{1,248}")


def unit_file_name(unit: str) -> str:
    if not _UNIT_NAME.fullmatch(unit) or unit.startswith("."):
        raise UserError(f"--unit {unit!r} is not a systemd unit name (letters, digits and : _ . \\ @ - only)")
    return unit if unit.endswith(".service") else f"{unit}.service"


def require_systemd() -> str:
    """The systemctl to run, once systemd is known to manage this machine; else a UserError saying so."""
    tool = shutil.which("systemctl")
    if tool is None:
        raise UserError("systemctl not found: this command needs systemd (render and install --root work without it)")
    if not BOOTED_MARK.is_dir():
        raise UserError(f"systemd is not running on this machine (no {BOOTED_MARK}: PID 1 is not systemd, "
                        "e.g. a container): this command needs it (render and install --root work without it)")
    return tool


def systemctl(*args: str, check: bool = True, timeout: float = SYSTEMCTL_TIMEOUT_SEC) -> subprocess.CompletedProcess:
    tool = require_systemd()
    try:
        proc = subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise UserError(f"systemctl {' '.join(args)} did not return within {timeout:.0f} s") from None
    if check and proc.returncode != 0:
        message = (proc.stderr or proc.stdout).strip().splitlines()
        raise UserError(f"systemctl {' '.join(args)} failed: {message[0] if message else f'exit {proc.returncode}'}")
    return proc


def show(unit: str, *props: str) -> dict[str, str]:
    proc = systemctl("show", unit_file_name(unit), "-p", ",".join(props))
    values = {}
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        values[key] = value
    return {prop: values.get(prop, "") for prop in props}


def main_pid(unit: str) -> int:
    value = show(unit, "MainPID")["MainPID"]
    return int(value) if value.isdigit() else 0


def installed_unit_path(unit: str) -> Path | None:
    """The unit file systemd loaded for `unit`, or None when it has none."""
    props = show(unit, "LoadState", "FragmentPath")
    if props["LoadState"] == "not-found" or not props["FragmentPath"]:
        return None
    return Path(props["FragmentPath"])

"""A real systemd as PID 1 of a private PID + mount namespace, for tests on a host without one.

Boot: `unshare --pid --fork --mount-proc --mount boot.sh`, where boot.sh makes
the mounts private, puts tmpfs on /tmp, /run and /var/tmp (systemd's boot-time
tmpfiles clean-up would otherwise empty the HOST's /tmp) and execs systemd into
basic.target (multi-user.target would start the host's installed services).
Commands reach it with `nsenter -t PID -p -m`. `stop()` kills its PID 1, which
ends every process in the namespace. Every wait here is bounded.

Paths the tests need (the checkout, the venv) may lie under one of those trees:
CI clones wherever it likes. The boot script carries each such path across the
tmpfs at the same place: before the tmpfs mounts it binds the path onto an empty
holding dir elsewhere on the host, afterwards it moves that bind onto the same
path inside the new tmpfs. systemd's tmpfiles clean-up stops at mount points, so
the carried trees are left alone, and all of it stays in the namespace.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Iterable

SYSTEMD = Path("/lib/systemd/systemd")
PRIVATE_MOUNTS = ("/tmp", "/run", "/var/tmp")
# On the host's own filesystem, outside every PRIVATE_MOUNTS tree; only empty dirs are made here.
HOLD_ROOT = Path("/var/lib/k26-test-hold")


def _hiding_mount(path: Path) -> str | None:
    """The private mount whose tmpfs would hide `path` inside the namespace (None: none would)."""
    for mount in PRIVATE_MOUNTS:
        if path == Path(mount) or Path(mount) in path.parents:
            return mount
    return None


def paths_to_carry(paths: Iterable[Path]) -> list[Path]:
    """The outermost of `paths` that a private tmpfs would hide, resolved as the kernel sees them."""
    hidden = sorted({Path(p).resolve() for p in paths if _hiding_mount(Path(p).resolve())})
    return [p for p in hidden if not any(other in p.parents for other in hidden)]


def boot_script(carried: dict[Path, Path]) -> str:
    """The namespace's init: private mounts, each carried path (-> its holding dir) kept, then systemd."""
    q = shlex.quote
    lines = ["#!/bin/sh", "mount --make-rprivate / || exit 1"]
    lines += [f"mount --rbind {q(str(path))} {q(str(hold))} || exit 1" for path, hold in carried.items()]
    lines += [f"mount -t tmpfs tmpfs {mount} || exit 1" for mount in PRIVATE_MOUNTS]
    lines += [f"mkdir -p {q(str(path))} && mount --move {q(str(hold))} {q(str(path))} || exit 1"
              for path, hold in carried.items()]
    lines.append(f"exec {SYSTEMD} --system --unit=basic.target")
    return "\n".join(lines) + "\n"


def unavailable_reason(visible: Iterable[Path]) -> str | None:
    """Why a namespaced systemd that sees the `visible` paths cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (unshare of PID and mount namespaces)"
    for tool in ("unshare", "nsenter", "systemctl"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux / systemd packages)"
    if not os.access(SYSTEMD, os.X_OK):
        return f"needs {SYSTEMD} (the systemd package)"
    for path in paths_to_carry(visible):
        if str(path) in PRIVATE_MOUNTS:
            # Carrying the host's whole /tmp (or /run) in would hand it to systemd's boot-time clean-up.
            return f"{path} is itself one of {', '.join(PRIVATE_MOUNTS)}, which the namespace must replace"
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "true"],
                               capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "unshare --pid --mount did not return within 20 s"
    if probe.returncode != 0:
        return f"unshare --pid --mount is not permitted here: {probe.stderr.strip()[:200]}"
    return None


class SystemdNamespace:
    def __init__(self, workdir: Path, visible: Iterable[Path] = ()):
        """`visible`: host paths the namespace must show at the same place (beyond what it shares anyway)."""
        self.workdir = workdir
        self.log = workdir / "systemd.log"
        self.pid: int | None = None
        self._unshare: subprocess.Popen | None = None
        self._carry = paths_to_carry(visible)
        self._hold_dir: Path | None = None

    def start(self, timeout: float = 90) -> None:
        carried = {}
        if self._carry:
            self._hold_dir = HOLD_ROOT / uuid.uuid4().hex[:12]
            for index, path in enumerate(self._carry):
                carried[path] = self._hold_dir / str(index)
                carried[path].mkdir(parents=True)
        boot = self.workdir / "boot.sh"
        boot.write_text(boot_script(carried))
        boot.chmod(0o755)
        with open(self.log, "wb") as log:
            self._unshare = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--mount-proc", "--mount", str(boot)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        self.pid = self._wait_for_pid1(deadline)
        state = ""
        while time.monotonic() < deadline:
            state = self.run(["systemctl", "is-system-running"], timeout=20).stdout.strip()
            if state in ("running", "degraded"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"namespaced systemd did not finish booting within {timeout:.0f} s (state {state!r}); "
                           f"log: {self.log_tail()}")

    def run(self, cmd: list[str], timeout: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
        """Run `cmd` inside the namespace (its /proc, /run and systemd), bounded by `timeout`."""
        assert self.pid, "namespace not started"
        full_env = {**os.environ, **(env or {})}
        try:
            return subprocess.run(
                ["nsenter", "-t", str(self.pid), "-p", "-m", "--", *cmd],
                capture_output=True, text=True, timeout=timeout, env=full_env,
            )
        except subprocess.TimeoutExpired as err:
            raise AssertionError(f"{' '.join(cmd)} did not finish within {timeout} s; output so far: "
                                 f"{err.stdout!r} {err.stderr!r}") from None

    def systemctl_show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.run(["systemctl", "show", unit, "-p", ",".join(props)]).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def journal(self, unit: str, lines: int = 60) -> str:
        return self.run(["journalctl", "-u", unit, "--no-pager", "-n", str(lines)], timeout=30).stdout

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.pid:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self._unshare is not None:
            try:
                self._unshare.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self._unshare.pid, signal.SIGKILL)
                self._unshare.wait(timeout=15)
        self.pid = None
        self._remove_hold_dirs()

    def _remove_hold_dirs(self) -> None:
        """rmdir only: on the host the holding dirs stay empty (their binds live in the namespace alone)."""
        if self._hold_dir is None:
            return
        for hold in (*sorted(self._hold_dir.glob("*")), self._hold_dir, HOLD_ROOT):
            try:
                hold.rmdir()
            except OSError:
                pass  # HOLD_ROOT stays while another namespace holds dirs in it
        self._hold_dir = None

    def _wait_for_pid1(self, deadline: float) -> int:
        """The host PID of the namespace's init: unshare's child, once it has exec'd systemd."""
        parent = self._unshare.pid
        while time.monotonic() < deadline:
            if self._unshare.poll() is not None:
                raise RuntimeError(f"unshare exited {self._unshare.returncode}; log: {self.log_tail()}")
            for entry in os.listdir("/proc"):
                if not entry.isdigit():
                    continue
                try:
                    stat = Path(f"/proc/{entry}/stat").read_text()
                    comm = Path(f"/proc/{entry}/comm").read_text().strip()
                except OSError:
                    continue
                if int(stat.rsplit(")", 1)[1].split()[1]) == parent and comm == "systemd":
                    return int(entry)
            time.sleep(0.1)
        raise RuntimeError(f"no systemd appeared under unshare (pid {parent}); log: {self.log_tail()}")

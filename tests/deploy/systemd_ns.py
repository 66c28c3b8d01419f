"""A real systemd as PID 1 of a private PID + mount namespace, for tests on a host without one.

Boot: `unshare --pid --fork --mount-proc --mount boot.sh`, where boot.sh makes
the mounts private, puts tmpfs on /tmp, /run and /var/tmp (systemd's boot-time
tmpfiles clean-up would otherwise empty the HOST's /tmp) and execs systemd into
basic.target (multi-user.target would start the host's installed services).
Commands reach it with `nsenter -t PID -p -m`. `stop()` kills its PID 1, which
ends every process in the namespace. Every wait here is bounded.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
PRIVATE_MOUNTS = ("/tmp", "/run", "/var/tmp")

BOOT_SCRIPT = """#!/bin/sh
mount --make-rprivate / || exit 1
for dir in {mounts}; do mount -t tmpfs tmpfs "$dir" || exit 1; done
exec {systemd} --system --unit=basic.target
"""


def unavailable_reason(repo: Path) -> str | None:
    """Why a namespaced systemd cannot run here (None: it can)."""
    if os.geteuid() != 0:
        return "needs root (unshare of PID and mount namespaces)"
    for tool in ("unshare", "nsenter", "systemctl"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux / systemd packages)"
    if not os.access(SYSTEMD, os.X_OK):
        return f"needs {SYSTEMD} (the systemd package)"
    for mount in PRIVATE_MOUNTS:
        if repo == Path(mount) or Path(mount) in repo.parents:
            return f"the checkout {repo} lies under {mount}, which the namespace hides behind a tmpfs"
    try:
        probe = subprocess.run(["unshare", "--pid", "--fork", "--mount-proc", "--mount", "true"],
                               capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        return "unshare --pid --mount did not return within 20 s"
    if probe.returncode != 0:
        return f"unshare --pid --mount is not permitted here: {probe.stderr.strip()[:200]}"
    return None


class SystemdNamespace:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.log = workdir / "systemd.log"
        self.pid: int | None = None
        self._unshare: subprocess.Popen | None = None

    def start(self, timeout: float = 90) -> None:
        boot = self.workdir / "boot.sh"
        boot.write_text(BOOT_SCRIPT.format(mounts=" ".join(PRIVATE_MOUNTS), systemd=SYSTEMD))
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

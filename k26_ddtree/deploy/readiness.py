"""Is THIS process serving? Socket ownership from /proc, /health_generate, a smoke generate.

A readiness answer must come from the unit's current main process: the field
lost hours to an old process that still answered on the port while the new one
was loading. So a probe first finds which process owns the listening socket
(Linux /proc: the socket inode in /proc/net/tcp{,6}, matched against the fd
links of the main PID and its descendants), and only then asks the server.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Callable
from urllib.parse import urlsplit

from k26_ddtree import jsonread
from k26_ddtree.processes import alive, descendants, pids


_LISTEN = "0A"
HTTP_TIMEOUT_SEC = 30
# Local servers only: an http_proxy in the environment must not reroute 127.0.0.1.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass(frozen=True)
class Probe:
    state: str  # dead, loading, foreign, starting, ready
    detail: str

    @property
    def ready(self) -> bool:
        return self.state == "ready"


def probe(pid: int, url: str, timeout: float = HTTP_TIMEOUT_SEC) -> Probe:
    """One look at whether `pid` (or a child) serves `url` and /health_generate says 200."""
    if pid <= 0 or not alive(pid):
        return Probe("dead", f"main process {pid} is not running")
    port = urlsplit(url).port or 80
    inodes = listening_inodes(port)
    if not inodes:
        return Probe("loading", f"pid {pid} is up; port {port} not listening yet")
    family = {pid} | descendants(pid)
    owners = socket_owners(inodes)
    owner = f"pid {pid} owns port {port}"
    if not owners & family:
        if _can_inspect(pid):
            others = ", ".join(str(p) for p in sorted(owners)) or "a process this user cannot inspect"
            return Probe("foreign", f"port {port} is held by pid {others}, not by main pid {pid} or its children")
        # Without root the fds of a root service are unreadable: say so rather than guess.
        owner = f"port {port} open (owner not checked: run as root to tie it to pid {pid})"
    code, body = http_get(url + "/health_generate", timeout=timeout)
    if code == 200:
        return Probe("ready", f"{owner}; /health_generate 200")
    return Probe("starting", f"{owner}; /health_generate {code or body}")


def wait_ready(
    main_pid: Callable[[], int],
    url: str,
    timeout: float,
    say: Callable[[str], None],
    interval: float = 1.0,
    report_every: float = 10.0,
) -> Probe:
    """Poll until ready, the process dies, or `timeout` passes; print progress every `report_every` s.

    Never raises on a refused connection or a bad answer: those are the normal
    states of a server that is still loading.
    """
    start = time.monotonic()
    last_report = -report_every
    last = Probe("loading", "not probed yet")
    while True:
        elapsed = time.monotonic() - start
        pid = main_pid()
        last = probe(pid, url, timeout=min(HTTP_TIMEOUT_SEC, max(1.0, timeout - elapsed)))
        if last.ready or last.state == "dead":
            return last
        if elapsed >= timeout:
            return Probe("timeout", f"not ready after {timeout:.0f} s: {last.detail}")
        if elapsed - last_report >= report_every:
            say(f"waiting for readiness [{elapsed:.0f}/{timeout:.0f} s]: {last.state}: {last.detail}")
            last_report = elapsed
        time.sleep(interval)


def smoke_generate(url: str, api_key: str | None) -> str | None:
    """One short greedy /generate; None when it answered with tokens, else what went wrong."""
    payload = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
    code, body = http_post(url + "/generate", payload, api_key)
    if code != 200:
        return f"smoke /generate answered {code or body}"
    try:
        tokens = jsonread.parse_json(body, "the smoke answer")["meta_info"]["completion_tokens"]
    except (ValueError, KeyError, TypeError):
        return f"smoke /generate answered 200 without meta_info.completion_tokens: {body[:120]!r}"
    return None if tokens >= 1 else "smoke /generate produced no tokens"


def server_info(url: str, api_key: str | None) -> dict | None:
    code, body = http_get(url + "/server_info", api_key=api_key)
    if code != 200:
        return None
    try:
        info = jsonread.parse_json(body, "the server_info answer")
    except jsonread.Unreadable:
        return None
    return info if isinstance(info, dict) else None


def listening_inodes(port: int) -> set[int]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table, encoding="ascii").read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if len(cols) > 9 and cols[3] == _LISTEN and int(cols[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(int(cols[9]))
    return inodes


def socket_owners(inodes: set[int]) -> set[int]:
    targets = {f"socket:[{inode}]" for inode in inodes}
    owners = set()
    for pid in pids():
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                if os.readlink(f"{fd_dir}/{name}") in targets:
                    owners.add(pid)
                    break
            except OSError:
                continue
    return owners


def process_uptime(pid: int) -> float | None:
    """Seconds since `pid` started, from /proc (no clock parsing)."""
    try:
        stat = open(f"/proc/{pid}/stat", encoding="ascii", errors="replace").read()
        boot_uptime = float(open("/proc/uptime", encoding="ascii").read().split()[0])
    except OSError:
        return None
    start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
    return max(0.0, boot_uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def http_get(url: str, api_key: str | None = None, timeout: float = HTTP_TIMEOUT_SEC) -> tuple[int, str]:
    return _request(urllib.request.Request(url, headers=_auth(api_key)), timeout)


def http_post(url: str, payload: dict, api_key: str | None, timeout: float = 120) -> tuple[int, str]:
    headers = {"Content-Type": "application/json", **_auth(api_key)}
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    return _request(request, timeout)


def _request(request: urllib.request.Request, timeout: float) -> tuple[int, str]:
    """(status, body); status 0 with the reason when there was no HTTP answer at all."""
    try:
        with _OPENER.open(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as err:
        reason = getattr(err, "reason", err)
        return 0, f"no answer ({reason})"


def _auth(api_key: str | None) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _can_inspect(pid: int) -> bool:
    try:
        os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    return True

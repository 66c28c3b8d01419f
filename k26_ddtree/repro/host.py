"""Facts about this machine, read from its tools without ever failing because one is missing.

Standard library only: `env/setup_env.sh` runs this before any venv exists.
"""

from __future__ import annotations

import http.client
import os
import platform
import re
import shutil
import subprocess
import urllib.request
from dataclasses import dataclass
from pathlib import Path

NOT_AVAILABLE = "not available"


@dataclass(frozen=True)
class ToolOutput:
    """What one external command said; `available` is False when it could not be started."""

    argv: tuple[str, ...]
    available: bool
    exit_code: int | None
    output: str

    @property
    def ok(self) -> bool:
        return self.available and self.exit_code == 0


def run_tool(argv: list[str], timeout: float = 60.0) -> ToolOutput:
    """Run a command and capture stdout+stderr; a missing binary or a hang is an answer, not an error."""
    if shutil.which(argv[0]) is None and not os.path.isfile(argv[0]):
        return ToolOutput(tuple(argv), False, None, f"{NOT_AVAILABLE}: {argv[0]} not found\n")
    try:
        proc = subprocess.run(
            argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            timeout=timeout, errors="replace", stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return ToolOutput(tuple(argv), True, None, f"timed out after {timeout:.0f} s\n")
    except OSError as err:
        return ToolOutput(tuple(argv), False, None, f"{NOT_AVAILABLE}: {err}\n")
    return ToolOutput(tuple(argv), True, proc.returncode, proc.stdout)


def gpu_list() -> list[str]:
    """`nvidia-smi -L` lines ("GPU 0: NVIDIA H200 (UUID: ...)"); empty without a working driver."""
    out = run_tool(["nvidia-smi", "-L"], timeout=30)
    if not out.ok:
        return []
    return [line.strip() for line in out.output.splitlines() if line.strip().startswith("GPU ")]


def driver_version() -> str | None:
    out = run_tool(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout=30)
    if not out.ok:
        return None
    lines = [line.strip() for line in out.output.splitlines() if line.strip()]
    return lines[0] if lines else None


def nvcc_release(nvcc: str | os.PathLike) -> str | None:
    """The "13.0" of `nvcc --version`'s "release 13.0, V13.0.88" line, or None."""
    out = run_tool([str(nvcc), "--version"], timeout=30)
    if not out.ok:
        return None
    match = re.search(r"release (\d+\.\d+)", out.output)
    return match.group(1) if match else None


def os_release(path: str | os.PathLike = "/etc/os-release") -> dict[str, str]:
    fields: dict[str, str] = {}
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return fields
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip():
            fields[key.strip()] = value.strip().strip('"')
    return fields


def machine_arch() -> str:
    return platform.machine() or "unknown"


def url_answers(url: str, timeout: float) -> bool:
    """Whether GET `url` gets a 200 within `timeout` seconds (no retries: a quick yes or no)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status == 200
    except (OSError, ValueError, http.client.HTTPException):  # URLError, HTTPError, timeouts: OSError
        return False


def hostname() -> str:
    return platform.node() or "unknown-host"

"""What nvidia-smi says about this machine's GPUs: names, NVLink vs PCIe, memory in use.

Every query returns None when there is no nvidia-smi or it fails (no driver,
no GPU): callers treat that as "no GPUs here", never as an exception.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import time
from dataclasses import dataclass

_NVLINK = re.compile(r"^NV\d+$")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Smi:
    ok: bool
    output: str  # stdout when ok, else why not


def run_smi(*args: str, timeout: float = 30) -> Smi:
    tool = shutil.which("nvidia-smi")
    if tool is None:
        return Smi(False, "nvidia-smi not on PATH")
    try:
        proc = subprocess.run([tool, *args], capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Smi(False, f"nvidia-smi {' '.join(args)} did not answer within {timeout:.0f} s")
    if proc.returncode != 0:
        first = (proc.stdout + proc.stderr).strip().splitlines()
        return Smi(False, f"nvidia-smi failed: {first[0] if first else f'exit {proc.returncode}'}")
    return Smi(True, proc.stdout)


def gpu_names() -> tuple[list[str] | None, str]:
    smi = run_smi("--query-gpu=name", "--format=csv,noheader")
    if not smi.ok:
        return None, smi.output
    names = [line.strip() for line in smi.output.splitlines() if line.strip()]
    return (names, "") if names else (None, "nvidia-smi lists no GPUs")


def nvlink_links(topo: str) -> int:
    """How many GPU-to-GPU cells of `nvidia-smi topo -m` are NVLink (NV#)."""
    lines = _ANSI.sub("", topo).splitlines()
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), None)
    if header is None:
        return 0
    gpu_columns = [i for i, name in enumerate(header) if re.fullmatch(r"GPU\d+", name)]
    links = 0
    for line in lines:
        cells = line.split()
        if not cells or not re.fullmatch(r"GPU\d+", cells[0]):
            continue
        values = cells[1:]
        links += sum(1 for i in gpu_columns if i < len(values) and _NVLINK.match(values[i]))
    return links


def topology() -> Smi:
    return run_smi("topo", "-m")


def memory_used_mib() -> tuple[list[int] | None, str]:
    smi = run_smi("--query-gpu=memory.used", "--format=csv,noheader,nounits")
    if not smi.ok:
        return None, smi.output
    try:
        return [int(float(line)) for line in smi.output.split()], ""
    except ValueError:
        return None, f"unexpected nvidia-smi memory output: {smi.output.strip()[:80]!r}"


def wait_memory_released(max_used_mib: int, timeout: float, say, interval: float = 2.0,
                         report_every: float = 10.0) -> tuple[bool, str]:
    """Wait, bounded, until every GPU uses at most `max_used_mib` (a previous instance has exited).

    (True, why) right away when there is no nvidia-smi or no GPU: nothing to wait for.
    """
    start = time.monotonic()
    last_report = -report_every
    while True:
        used, why = memory_used_mib()
        if used is None:
            return True, f"no GPU memory to wait for ({why})"
        busy = {i: mib for i, mib in enumerate(used) if mib > max_used_mib}
        if not busy:
            return True, f"GPU memory free on {len(used)} GPUs (max {max(used, default=0)} MiB used)"
        elapsed = time.monotonic() - start
        listing = ", ".join(f"GPU{i} {mib} MiB" for i, mib in busy.items())
        if elapsed >= timeout:
            return False, f"GPU memory still in use after {timeout:.0f} s: {listing} (see nvidia-smi)"
        if elapsed - last_report >= report_every:
            say(f"waiting for GPU memory to be released [{elapsed:.0f}/{timeout:.0f} s]: {listing}")
            last_report = elapsed
        time.sleep(interval)

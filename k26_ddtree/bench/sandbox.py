"""Grade generated code against hidden tests, in the isolation `isolation.py` picks.

The verdict cannot come from what the code prints: a pass is exit status 0 together with
exactly the run's nonce on a pipe that the runner (`sandbox_runner.py`) writes only after
the last hidden test passed. The nonce is random per run and never appears in the code's
input, environment, argv or files. A solution that reads the runner's own frames could still
fake a pass, which grading inside one process cannot rule out; the sandbox, not the grade,
is what keeps the machine safe from it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.isolation import Isolation, detect_isolation

RUNNER_SOURCE = Path(__file__).with_name("sandbox_runner.py").read_text(encoding="utf-8")
FSIZE_MB = 16
EXTRA_PROCESSES = 32  # threads and processes the code may add to what its uid already runs
STDERR_TAIL_BYTES = 16 * 1024


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    reason: str
    duration_s: float


def _tasks_of(uid: int) -> int:
    """Threads and processes of `uid` now: RLIMIT_NPROC counts them all, machine-wide."""
    count = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            if entry.stat().st_uid == uid:
                count += len(os.listdir(f"/proc/{entry.name}/task"))
        except OSError:
            continue  # exited meanwhile
    return count


def _failure_reason(stderr: bytes, status: int) -> str:
    lines = [line for line in stderr.decode(errors="replace").strip().splitlines() if line.strip()]
    if lines:
        return lines[-1][:300]
    if status < 0:
        return f"killed by signal {signal.Signals(-status).name}"
    return f"exit status {status} without the pass mark"


def _tail(handle) -> bytes:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - STDERR_TAIL_BYTES))
    return handle.read()


def run_tests(code: str, tests: str, timeout_s: float = 10.0, memory_mb: int = 1024,
              isolation: Isolation | None = None) -> SandboxResult:
    """Run `code`, then `tests` (plain asserts) in the same namespace, isolated."""
    isolation = isolation or detect_isolation()
    nonce = secrets.token_hex(16).encode()
    limits = [int(timeout_s) + 1, memory_mb, _tasks_of(isolation.uid) + EXTRA_PROCESSES, FSIZE_MB]
    started = time.monotonic()
    # Files only the harness can see: the code's input and its stderr (RLIMIT_FSIZE caps that).
    with tempfile.TemporaryDirectory(prefix="k26-grade-") as private:
        task = Path(private, "task.json")
        task.write_text(json.dumps({"solution": code, "tests": tests}), encoding="utf-8")
        nonce_read, nonce_write = os.pipe()
        os.write(nonce_write, nonce)
        os.close(nonce_write)
        result_read, result_write = os.pipe()
        os.set_blocking(result_read, False)
        argv = [*isolation.python.argv(), "-c", RUNNER_SOURCE, str(nonce_read), str(result_write),
                *(str(v) for v in limits)]
        try:
            with open(task, "rb") as stdin, open(Path(private, "stderr"), "w+b") as stderr:
                with isolation.started(argv, pass_fds=(nonce_read, result_write), stdin=stdin,
                                       stdout=subprocess.DEVNULL, stderr=stderr) as proc:
                    try:
                        status = proc.wait(timeout=timeout_s)
                    except subprocess.TimeoutExpired:
                        status = None
                errors = _tail(stderr)
        finally:
            os.close(nonce_read)
            os.close(result_write)
            try:
                report = os.read(result_read, 4096)
            except BlockingIOError:
                report = b""
            os.close(result_read)
    duration = time.monotonic() - started
    if status is None:
        return SandboxResult(False, f"timeout after {timeout_s:g}s", duration)
    if status == 0 and report == nonce + b"\n":
        return SandboxResult(True, "passed", duration)
    return SandboxResult(False, _failure_reason(errors, status), duration)

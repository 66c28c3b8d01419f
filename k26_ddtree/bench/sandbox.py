"""Run generated code against hidden tests in a sandbox.

Layers, each recorded in the eval's `sandbox` note:
- a separate Python process (`-I`: no site, no environment) in a fresh temp
  dir as cwd, killed with its process group at the timeout;
- rlimits: CPU seconds, address space, file size, process count;
- a network namespace: `unshare --net` as root (then also setuid to nobody so
  the filesystem's permissions keep it out of the rest of the machine), or
  `unshare -rn` as a user; when neither works the run says so;
- inside, an audit hook (PEP 578) refuses writes outside the temp dir,
  subprocesses, sockets and ctypes before the model's code runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

NOBODY = 65534
PASS_MARK = "K26-SANDBOX-PASS"

# Runs inside the sandbox. It reads the nonce before the model's code exists,
# so a stray os._exit(0) in that code cannot pass for success.
RUNNER = r'''
import os, sys
nonce = sys.stdin.readline().strip()
root = os.path.abspath(os.getcwd())
solution = open("solution.py").read()
tests = open("tests.py").read()
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

def inside(path):
    if isinstance(path, int):
        return True
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    full = os.path.normpath(os.path.join(root, os.fspath(path)))
    return full == root or full.startswith(root + os.sep)

def deny(event):
    raise PermissionError(f"sandbox: {event} is not allowed")

BLOCKED = {"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
           "os.forkpty", "pty.spawn", "socket.connect", "socket.bind", "socket.sendto", "socket.sendmsg",
           "socket.getaddrinfo", "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "os.symlink", "os.link",
           "os.chroot", "os.kill", "os.killpg"}
PATH_EVENTS = {"os.remove", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate", "os.utime",
               "shutil.rmtree", "os.rename", "shutil.copyfile", "shutil.move"}

def hook(event, args):
    if event in BLOCKED:
        deny(event)
    if event == "open":
        path, mode, flags = args
        writing = (mode is not None and any(c in mode for c in "wax+")) or (
            mode is None and flags is not None and flags & WRITE_FLAGS)
        if writing and not inside(path):
            deny(f"writing {path}")
    elif event in PATH_EVENTS:
        for arg in args:
            if isinstance(arg, (str, bytes, os.PathLike)) and not inside(arg):
                deny(f"{event} on {arg}")

sys.addaudithook(hook)
namespace = {"__name__": "solution"}
exec(compile(solution, "solution.py", "exec"), namespace)
exec(compile(tests, "tests.py", "exec"), namespace)
print("''' + PASS_MARK + r'''", nonce, flush=True)
'''


@dataclass(frozen=True)
class Isolation:
    """How the sandboxed process is started; `note` goes into the results."""

    prefix: tuple[str, ...]
    note: str
    setuid_nobody: bool


@dataclass(frozen=True)
class SandboxResult:
    passed: bool
    reason: str
    duration_s: float


@contextlib.contextmanager
def _workdir(shared: bool):
    """A fresh temp dir; `shared` opens it to uid nobody (the dir only: its files stay root's)."""
    with tempfile.TemporaryDirectory(prefix="k26-sandbox-") as path:
        if shared:
            os.chmod(path, 0o777)
        yield Path(path)


def _works(argv: list[str], shared: bool) -> bool:
    """Can this prefix start the interpreter in a sandbox dir and write there?"""
    probe = "open('probe', 'w').write('ok')"
    with _workdir(shared) as work:
        try:
            done = subprocess.run(argv + ["-c", probe], cwd=work, capture_output=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0 and (work / "probe").is_file()


def python_command() -> list[str]:
    """The interpreter for sandboxed code: this one, resolved (venv links may sit in unreadable homes)."""
    return [os.path.realpath(sys.executable), "-I", "-S"]


@functools.lru_cache(maxsize=1)
def detect_isolation() -> Isolation:
    """The strongest isolation this machine allows, probed once with the real interpreter."""
    unshare = shutil.which("unshare")
    python = python_command()
    if unshare and os.geteuid() == 0:
        as_nobody = [unshare, "--net", "--setgid", str(NOBODY), "--setuid", str(NOBODY), "--"]
        if _works(as_nobody + python, shared=True):
            return Isolation(tuple(as_nobody), "network namespace (unshare --net), uid nobody, audit hook", True)
        if _works([unshare, "--net", "--"] + python, shared=False):
            return Isolation(
                (unshare, "--net", "--"),
                "network namespace (unshare --net); uid nobody cannot run this interpreter, so writes "
                "outside the temp dir are refused by the audit hook",
                False,
            )
    if unshare and _works([unshare, "-rn", "--"] + python, shared=False):
        return Isolation((unshare, "-rn", "--"), "network namespace (unshare -rn), audit hook", False)
    return Isolation((), "no network namespace available: sockets refused by the audit hook only", False)


def _limit(cpu_s: int, memory_mb: int) -> None:
    """preexec_fn: rlimits for the sandboxed process (runs in the child after fork)."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    memory = memory_mb * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (16 * 1024 * 1024, 16 * 1024 * 1024))
    resource.setrlimit(resource.RLIMIT_NPROC, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _failure_reason(stderr: str, returncode: int) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    if lines:
        return lines[-1][:300]
    if returncode < 0:
        return f"killed by signal {signal.Signals(-returncode).name}"
    return f"exit status {returncode} without the pass mark"


def run_tests(code: str, tests: str, timeout_s: float = 10.0, memory_mb: int = 1024) -> SandboxResult:
    """Run `code`, then `tests` (plain asserts) in the same namespace, sandboxed."""
    isolation = detect_isolation()
    nonce = secrets.token_hex(16)
    started = time.monotonic()
    with _workdir(isolation.setuid_nobody) as work:
        for name, text in (("solution.py", code), ("tests.py", tests), ("runner.py", RUNNER)):
            (work / name).write_text(text)
            os.chmod(work / name, 0o644)
        argv = [*isolation.prefix, *python_command(), "runner.py"]
        proc = subprocess.Popen(
            argv,
            cwd=work,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
            preexec_fn=functools.partial(_limit, int(timeout_s) + 1, memory_mb),
        )
        try:
            stdout, stderr = proc.communicate(nonce + "\n", timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return SandboxResult(False, f"timeout after {timeout_s:g}s", time.monotonic() - started)
    duration = time.monotonic() - started
    if proc.returncode == 0 and f"{PASS_MARK} {nonce}" in stdout:
        return SandboxResult(True, "passed", duration)
    return SandboxResult(False, _failure_reason(stderr, proc.returncode), duration)

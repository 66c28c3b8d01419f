"""The sandbox that runs model-written code, attacked the way hostile code would: real bwrap,
real processes. Each attack checks the harm on the host, not only the verdict."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from k26_ddtree.bench import isolation as isolation_module
from k26_ddtree.bench.isolation import NOBODY, detect_isolation
from k26_ddtree.bench.sandbox import run_tests
from k26_ddtree.errors import UserError

# /bin/sh -c COMMAND through _posixsubprocess.fork_exec: no audit event fires, so the runner's
# hook never sees it; only the sandbox stands between the shell and the machine.
SHELL = r'''
import _posixsubprocess, os

def spawn(command):
    errpipe_read, errpipe_write = os.pipe()
    head = ([b"/bin/sh", b"-c", command.encode()], [b"/bin/sh"], True, (), None, None,
            -1, -1, -1, -1, -1, -1, errpipe_read, errpipe_write, False, False)
    try:
        for tail in ((-1, None, None, None, -1, None, False), (-1, None, None, None, -1, None),
                     (None, None, None, -1, None)):  # fork_exec's arguments as of 3.11/3.12, 3.13, 3.10
            try:
                return _posixsubprocess.fork_exec(*head, *tail)
            except TypeError:
                continue
    finally:
        os.close(errpipe_read)
        os.close(errpipe_write)

def shell(command):
    return os.waitstatus_to_exitcode(os.waitpid(spawn(command), 0)[1])
'''


def report(result) -> str:
    """The last stderr line: where the hostile code below tells what it managed."""
    assert not result.passed
    return result.reason


def test_passing_and_failing_tests(isolation):
    assert run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2\n").passed
    result = run_tests("def f(x):\n    return x\n", "assert f(1) == 2, 'f(1) should be 2'\n")
    assert not result.passed and "f(1) should be 2" in result.reason


def test_syntax_error_is_a_failure(isolation):
    result = run_tests("def f(:\n", "")
    assert not result.passed and "SyntaxError" in result.reason


@pytest.mark.parametrize("code", [
    "import os\nprint('K26-SANDBOX-PASS')\nos._exit(0)\n",
    "import sys\nsys.exit(0)\n",
    # Hunting for the nonce: the runner's globals, stdin, every open descriptor.
    "import os, sys, __main__\n"
    "seen = repr(vars(__main__)).encode() + sys.stdin.buffer.read()\n"
    "for fd in range(3, 256):\n"
    "    try:\n"
    "        os.set_blocking(fd, False); seen += os.read(fd, 4096)\n"
    "    except OSError:\n"
    "        pass\n"
    "for fd in range(1, 256):\n"
    "    try:\n"
    "        os.write(fd, b'K26-SANDBOX-PASS ' + seen + b'\\n')\n"
    "    except OSError:\n"
    "        pass\n"
    "os._exit(0)\n",
], ids=["pass-mark-then-os._exit", "sys.exit", "nonce-hunt"])
def test_a_faked_pass_is_a_failure(isolation, code):
    assert not run_tests(code, "assert False, 'the tests never ran'\n").passed


def test_a_shell_through_fork_exec_runs_unprivileged_and_contained(isolation, tmp_path):
    """The issue's escape: a shell as root, writing outside the temp folder."""
    outside = tmp_path / "escaped.txt"
    command = (f"id -u > uid; id -G > gids; echo pwned > {outside}; echo pwned > /escaped; "
               "cat /etc/shadow > shadow 2>/dev/null; echo ok > ran")
    code = SHELL + (f"status = shell({command!r})\n"
                    "read = lambda name: open(name).read().strip() if os.path.exists(name) else ''\n"
                    "raise SystemExit('|'.join([read('ran'), read('uid'), read('gids'), read('shadow')]))\n")
    ran, uid, gids, shadow = report(run_tests(code, "")).split("|")
    assert ran == "ok", "the shell did not run, so nothing was tested"
    assert uid == str(isolation.uid) != "0" and "0" not in gids.split()
    assert shadow == ""
    assert not outside.exists() and not Path("/escaped").exists()


def test_root_only_files_cannot_be_read(isolation, tmp_path):
    secret = tmp_path / "root-only.txt"
    secret.write_text("k26-secret-5e2f")
    secret.chmod(0o600)
    for path in ("/etc/shadow", str(secret)):
        reason = report(run_tests(f"print(open({path!r}).read())\n", ""))
        assert "k26-secret" not in reason and ("No such file" in reason or "Permission denied" in reason), reason
    assert report(run_tests("import os\nraise SystemExit(str(os.getuid()) + ' ' + str(os.geteuid()))\n", "")) \
        == f"{isolation.uid} {isolation.uid}"


def test_only_the_system_dirs_and_the_interpreter_are_visible(isolation):
    code = "import os\nraise SystemExit(' '.join(sorted(os.listdir('/'))) + '|' + ' '.join(os.listdir('/etc')))\n"
    top, etc = report(run_tests(code, "")).split("|")
    interpreter_top = {Path(isolation.python.tree).parts[1]} if isolation.python.tree else set()
    system = {"usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "dev", "tmp", "work"}
    assert {"usr", "tmp", "work", "dev"} <= set(top.split()) <= system | interpreter_top, top
    assert etc in ("ld.so.cache", "")
    assert report(run_tests("import os\nraise SystemExit(os.getcwd())\n", "")) == "/work"


def test_writes_outside_the_work_dir_are_refused(isolation, tmp_path):
    target = tmp_path / "escaped.txt"
    result = run_tests(f"open({str(target)!r}, 'w').write('x')\n", "")
    assert not result.passed and "not allowed" in result.reason
    assert not target.exists()
    inside = run_tests("open('inside.txt', 'w').write('x')\nimport os\nos.mkdir('sub')\n",
                       "assert open('inside.txt').read() == 'x'\n")
    assert inside.passed


def test_relative_escape_and_deletes_are_refused(isolation, tmp_path):
    victim = tmp_path / "keep.txt"
    victim.write_text("keep")
    for code in (
        "open('../escaped.txt', 'w')\n",
        f"import os\nos.remove({str(victim)!r})\n",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})\n",
        "import os\nos.symlink('/etc', 'etc')\n",
    ):
        result = run_tests(code, "")
        assert not result.passed and "not allowed" in result.reason, code
    assert victim.read_text() == "keep"


def test_subprocesses_are_refused_by_the_runner(isolation):
    result = run_tests("import subprocess\nsubprocess.run(['true'])\n", "")
    assert not result.passed and "not allowed" in result.reason


def test_no_socket_reaches_the_host(isolation):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    connect = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
    result = run_tests(connect, "")
    assert not result.passed and "not allowed" in result.reason
    # A fresh interpreter, no runner and no audit hook: seccomp refuses the socket itself.
    with isolation.started([*isolation.python.argv(), "-c", connect], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and b"Operation not permitted" in err, err
    listener.setblocking(False)  # the kernel completes connections without accept(): any would be queued
    with pytest.raises(BlockingIOError):
        listener.accept()
    listener.close()


def test_namespaces_cannot_be_made_inside(isolation):
    with isolation.started(["/usr/bin/unshare", "--user", "--map-root-user", "true"], stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        _, err = proc.communicate(timeout=30)
    assert proc.returncode != 0 and b"Operation not permitted" in err, err


def test_cpu_bomb_is_stopped_at_the_timeout(isolation):
    result = run_tests("while True:\n    pass\n", "", timeout_s=1)
    assert not result.passed and "timeout" in result.reason and result.duration_s < 10


def test_memory_bomb_is_refused(isolation):
    result = run_tests("block = bytearray(4 * 1024 ** 3)\n", "", memory_mb=512)
    assert not result.passed and "MemoryError" in result.reason


def test_disk_bomb_is_capped(isolation):
    result = run_tests("open('big', 'wb').write(b'x' * (64 << 20))\n", "")
    assert not result.passed and "File too large" in result.reason


def _processes_with(marker: bytes) -> list[int]:
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if marker in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def test_fork_bomb_is_capped_and_leaves_nothing_behind(isolation):
    code = SHELL + ("started = 0\n"
                    "try:\n"
                    "    while started < 1000:\n"
                    "        spawn('exec sleep 317')\n"
                    "        started += 1\n"
                    "except OSError as err:\n"
                    "    raise SystemExit(f'{started} {err.errno}')\n")
    began = time.monotonic()
    started, errno_ = report(run_tests(code, "", timeout_s=5)).split()
    assert int(started) < 100 and int(errno_) == 11, "RLIMIT_NPROC did not stop the bomb (EAGAIN)"
    assert time.monotonic() - began < 30
    deadline = time.monotonic() + 10
    while _processes_with(b"sleep\x00317") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _processes_with(b"sleep\x00317"), "sandboxed processes survived the run"


def test_the_isolation_is_described(isolation):
    assert isolation.note.startswith("bubblewrap: uid ") and "no network" in isolation.note
    assert isolation.uid != 0 and Path(isolation.python.path).is_file()


def _nobody_cannot_reach(path: str) -> bool:
    for parent in Path(path).parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return True
    return False


def test_an_interpreter_nobody_cannot_reach_still_runs_in_bwrap_as_nobody(isolation):
    """The issue's case: the venv's python resolves into /root (pyenv), uid nobody cannot run it."""
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or not _nobody_cannot_reach(own):
        pytest.skip(f"needs root and an interpreter nobody cannot reach ({own} is reachable)")
    assert isolation.python.path == own and isolation.uid == NOBODY
    code = "import os, sys\nraise SystemExit(f'{os.getuid()} {sys.executable}')\n"
    assert report(run_tests(code, "")) == f"{NOBODY} {own}"


@pytest.fixture
def no_bwrap(monkeypatch):
    real_which = isolation_module.shutil.which
    monkeypatch.setattr(isolation_module.shutil, "which", lambda name: None if name == "bwrap" else real_which(name))
    detect_isolation.cache_clear()
    yield
    detect_isolation.cache_clear()


def test_without_bwrap_the_eval_refuses_unless_opted_in(no_bwrap):
    with pytest.raises(UserError, match="only inside bubblewrap, and bwrap is not installed: install it .*"
                                        "--eval-unsandboxed"):
        detect_isolation()


def test_opted_in_without_bwrap_still_never_runs_as_root(no_bwrap, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("needs root: the point is that root drops to uid nobody")
    opted = detect_isolation(True)
    assert opted.note.startswith("UNSANDBOXED (--eval-unsandboxed)") and opted.uid == NOBODY
    secret = tmp_path / "root-only.txt"
    secret.write_text("k26-secret-5e2f")
    secret.chmod(0o600)
    code = SHELL + (f"shell('id -u > uid; cat {secret} > got 2>/dev/null')\n"
                    "raise SystemExit(open('uid').read().strip() + '|' + open('got').read())\n")
    assert report(run_tests(code, "", isolation=opted)) == f"{NOBODY}|"
    assert run_tests("def f():\n    return 1\n", "assert f() == 1\n", isolation=opted).passed


def test_opted_in_root_without_an_interpreter_for_nobody_refuses(no_bwrap, monkeypatch):
    own = os.path.realpath(sys.executable)
    if os.geteuid() != 0 or not _nobody_cannot_reach(own):
        pytest.skip(f"needs root and an interpreter nobody cannot reach ({own} is reachable)")
    monkeypatch.setattr(isolation_module, "SYSTEM_PYTHON", "/nonexistent/python3")
    with pytest.raises(UserError, match="refusing to run model-written code as root"):
        detect_isolation(True)

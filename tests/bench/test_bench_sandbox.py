"""The sandbox that runs generated code: limits, containment, no network."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from k26_ddtree.bench import sandbox
from k26_ddtree.bench.sandbox import detect_isolation, python_command, run_tests


def test_passing_and_failing_tests():
    assert run_tests("def f(x):\n    return x + 1\n", "assert f(1) == 2\n").passed
    result = run_tests("def f(x):\n    return x\n", "assert f(1) == 2, 'f(1) should be 2'\n")
    assert not result.passed and "f(1) should be 2" in result.reason


def test_syntax_error_is_a_failure():
    result = run_tests("def f(:\n", "")
    assert not result.passed and "SyntaxError" in result.reason


def test_timeout_kills_the_process():
    result = run_tests("while True:\n    pass\n", "", timeout_s=1)
    assert not result.passed and "timeout" in result.reason


def test_memory_limit():
    result = run_tests("block = bytearray(4 * 1024 ** 3)\n", "", memory_mb=512)
    assert not result.passed and "MemoryError" in result.reason


def test_early_exit_does_not_pass():
    result = run_tests("import os\nos._exit(0)\n", "assert False\n")
    assert not result.passed


def test_writes_stay_inside_the_temp_dir(tmp_path):
    target = tmp_path / "escaped.txt"
    result = run_tests(f"open({str(target)!r}, 'w').write('x')\n", "")
    assert not result.passed and "not allowed" in result.reason
    assert not target.exists()
    inside = run_tests("open('inside.txt', 'w').write('x')\nimport os\nos.mkdir('sub')\n", "assert open('inside.txt').read() == 'x'\n")
    assert inside.passed


def test_relative_escape_and_deletes_are_refused(tmp_path):
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


def test_subprocesses_are_refused():
    result = run_tests("import subprocess\nsubprocess.run(['true'])\n", "")
    assert not result.passed and "not allowed" in result.reason


def test_sockets_are_refused_inside_the_runner():
    result = run_tests("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n", "")
    assert not result.passed and "not allowed" in result.reason


def test_network_namespace_blocks_loopback_to_the_host():
    isolation = detect_isolation()
    if not isolation.prefix:
        pytest.skip(f"no network namespace here: {isolation.note}")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    accepted = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    probe = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
    # Without the audit hook: the namespace alone must keep the host's loopback out of reach.
    done = subprocess.run([*isolation.prefix, *python_command(), "-c", probe], capture_output=True, text=True, timeout=30)
    listener.close()
    assert done.returncode != 0, "connected to the host from inside the namespace"
    assert not accepted


def test_the_isolation_is_described():
    note = detect_isolation().note
    assert "audit hook" in note
    assert Path(python_command()[0]).is_file()


def test_as_nobody_the_filesystem_keeps_code_out(monkeypatch, tmp_path):
    """Root with an interpreter nobody may run (a system python): the setuid layer is used and holds."""
    system_python = Path("/usr/bin/python3")
    if os.geteuid() != 0 or not shutil.which("unshare") or not system_python.exists():
        pytest.skip("needs root, unshare and /usr/bin/python3")
    monkeypatch.setattr(sandbox, "python_command", lambda: [os.path.realpath(system_python), "-I", "-S"])
    sandbox.detect_isolation.cache_clear()
    try:
        isolation = sandbox.detect_isolation()
        if not isolation.setuid_nobody:
            pytest.skip(f"uid nobody cannot run {system_python} in a namespace here: {isolation.note}")
        assert sandbox.run_tests("def f():\n    return 1\n", "assert f() == 1\n").passed
        assert sandbox.run_tests("import os\nassert os.getuid() == 65534\nopen('mine.txt', 'w').write('x')\n", "").passed
        # Even past the audit hook (a fresh interpreter in the same prefix), root's files are out of reach.
        tmp_path.chmod(0o755)
        victim = tmp_path / "root-owned.txt"
        victim.write_text("keep")
        probe = f"open({str(victim)!r}, 'w').write('gone')"
        done = subprocess.run([*isolation.prefix, *sandbox.python_command(), "-c", probe], capture_output=True,
                              text=True, timeout=30)
        assert done.returncode != 0 and "Permission denied" in done.stderr
        assert victim.read_text() == "keep"
    finally:
        sandbox.detect_isolation.cache_clear()

"""Helpers the deploy tests import: the CLI as a subprocess, free ports, where scratch goes.

(Kept out of conftest.py: several test folders have a conftest, and `import conftest`
would find whichever pytest loaded last.)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
# systemd tests keep scratch out of /tmp: the namespace mounts a private tmpfs there.
SCRATCH = REPO / ".cache" / "deploy-tests"


def k26(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """`python -m k26_ddtree ARGS` as a user runs it: exit code, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "k26_ddtree", *args],
        capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})},
    )


def one_line_error(proc) -> str:
    """The one stderr line of a CLI run that failed as a user mistake (exit 2, no traceback, no stdout)."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("k26-deploy: error: ")
    assert proc.stdout == ""
    return lines[0]


def directives(text: str, key: str) -> list[str]:
    return [line.split("=", 1)[1] for line in text.splitlines() if line.startswith(f"{key}=")]


def exec_start_words(text: str) -> list[str]:
    start = text.index("ExecStart=")
    block = text[start + len("ExecStart="):].split("\n# ", 1)[0].split("\nExecStartPost=", 1)[0]
    return block.replace("\\\n", " ").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

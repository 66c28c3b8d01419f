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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

"""Helpers for the repro tests: a fake nvidia-smi, a PATH without one, the CLI runner, package
indexes on 127.0.0.1 that answer or refuse."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[2]

FAKE_NVIDIA_SMI = """#!/bin/sh
# Stands in for nvidia-smi on a CPU machine: 8 GPUs of the NAME below, driver DRIVER.
case "$*" in
  "-L") i=0; while [ $i -lt 8 ]; do echo "GPU $i: NAME (UUID: GPU-0000000$i)"; i=$((i+1)); done ;;
  *driver_version*) i=0; while [ $i -lt 8 ]; do echo "DRIVER"; i=$((i+1)); done ;;
  "topo -m") printf '\\tGPU0\\tGPU1\\nGPU0\\t X \\tNV18\\nGPU1\\tNV18\\t X \\n' ;;
  *) echo "fake nvidia-smi: $*" ;;
esac
"""


def cpu_path() -> str:
    """PATH without any nvidia-smi on it, so the machine reads as having no GPU."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not Path(d, "nvidia-smi").exists()]
    return os.pathsep.join(dirs)


def run_cli(*args: str, path: str | None = None, cwd: Path | None = None, timeout: float = 300,
            extra_env: dict | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path if path is not None else cpu_path())
    env.update(extra_env or {})
    return subprocess.run(
        [sys.executable, "-m", "k26_ddtree", *args], cwd=cwd or REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout,
    )


@contextlib.contextmanager
def local_index(projects: dict[str, str] | None = None) -> Iterator[str]:
    """A package index on 127.0.0.1 (a real HTTP server in a thread), yielding its URL: `projects`
    maps a name to the HTML its simple page returns; every other path is a 404."""
    pages = {f"/simple/{name}/": html.encode() for name, html in (projects or {}).items()}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages.get(self.path, b"")
            self.send_response(200 if self.path in pages else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def closed_port_url() -> str:
    """An http URL on 127.0.0.1 where nothing listens: connections are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"

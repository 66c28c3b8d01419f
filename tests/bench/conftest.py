"""The stand-in SGLang server on 127.0.0.1, started as a real subprocess per test (serving a
model folder whose config.json names its vocabulary), and the eval's sandbox."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from model_server import write_model_folder

from k26_ddtree.bench.isolation import detect_isolation
from k26_ddtree.errors import UserError

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
START_TIMEOUT_S = 30
STANDIN_VOCAB = 32000


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StandIn:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path):
        self.proc = proc
        self.port = port
        self.log = log
        self.url = f"http://127.0.0.1:{port}"


def _wait_healthy(server: StandIn) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"stand-in exited {server.proc.returncode}: {server.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{server.url}/health_generate", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.1)
    raise RuntimeError(f"stand-in not healthy after {START_TIMEOUT_S}s: {server.log.read_text()}")


@pytest.fixture
def standin(tmp_path):
    """Factory: standin(env={...}, args=[...]) -> a healthy StandIn; all are stopped after the test."""
    started: list[StandIn] = []

    def start(env: dict | None = None, args: list[str] | None = None) -> StandIn:
        port = free_port()
        log = tmp_path / f"standin-{port}.log"
        args = list(args or [])
        if "--model-path" not in args:
            args += ["--model-path", str(write_model_folder(tmp_path / f"model-{port}", STANDIN_VOCAB))]
        full_env = {
            **os.environ,
            "PYTHONPATH": str(STANDIN),
            "STANDIN_LOAD_SECONDS": "0",
            "STANDIN_WARMUP_SECONDS": "0",
            "STANDIN_TOKENS_PER_S": "20000",
            **(env or {}),
        }
        with open(log, "w") as handle:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sglang.launch_server", "--port", str(port), *args],
                env=full_env,
                stdout=handle,
                stderr=subprocess.STDOUT,
            )
        server = StandIn(proc, port, log)
        started.append(server)
        _wait_healthy(server)
        return server

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.send_signal(signal.SIGTERM)
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait(timeout=10)


@pytest.fixture
def isolation():
    """The sandbox the eval would use; the test is skipped, saying why, where bubblewrap cannot run."""
    try:
        return detect_isolation()
    except UserError as err:
        pytest.skip(f"no sandbox on this machine: {err}")

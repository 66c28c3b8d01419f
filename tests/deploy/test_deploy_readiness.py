"""wait-ready ties readiness to one process: the owner of the listening socket, never a stale server."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from as_nobody import NobodyTree

from deploy_helpers import STANDIN, free_port, k26

from k26_ddtree import processes
from k26_ddtree.deploy import readiness


def start_standin(port: int, shell_parent: bool = False, **env) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "sglang.launch_server", "--port", str(port), "--speculative-ddtree-budget", "8"]
    if shell_parent:
        # `; true` keeps sh as the parent instead of exec'ing the server.
        cmd = ["sh", "-c", " ".join(cmd) + "; true"]
    return subprocess.Popen(
        cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(STANDIN), "STANDIN_LOAD_SECONDS": "0.3",
             "STANDIN_WARMUP_SECONDS": "0.3", **env},
    )


@pytest.fixture
def servers():
    started: list[subprocess.Popen] = []

    def start(port: int, **kwargs) -> subprocess.Popen:
        proc = start_standin(port, **kwargs)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        for child in processes.descendants(proc.pid):
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.kill()
        proc.wait(timeout=10)


def wait_ready(port: int, *args: str, env: dict | None = None):
    return k26("wait-ready", "--unit", "k26-test", "--url", f"http://127.0.0.1:{port}", *args, env=env)


def test_ready_when_this_pid_serves(servers):
    port = free_port()
    server = servers(port)
    proc = wait_ready(port, "--pid", str(server.pid), "--timeout", "20")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ready: pid {server.pid} owns port {port}; /health_generate 200" in proc.stdout


def test_mainpid_from_systemd_environment_and_a_child_owning_the_socket(servers):
    port = free_port()
    shell = servers(port, shell_parent=True)
    proc = wait_ready(port, "--timeout", "20", env={"MAINPID": str(shell.pid)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"(pid {shell.pid})" in proc.stdout


def test_a_stale_server_on_the_port_does_not_count(servers):
    port = free_port()
    stale = servers(port)
    assert readiness.wait_ready(lambda: stale.pid, f"http://127.0.0.1:{port}", 20, print).ready
    newcomer = subprocess.Popen(["sleep", "30"])
    try:
        proc = wait_ready(port, "--pid", str(newcomer.pid), "--timeout", "2")
    finally:
        newcomer.kill()
        newcomer.wait(timeout=10)
    assert proc.returncode == 1
    assert f"port {port} is held by pid {stale.pid}, not by main pid {newcomer.pid}" in proc.stderr


def test_a_dead_main_process_ends_the_wait_at_once(servers):
    port = free_port()
    server = servers(port, STANDIN_FAIL="start")
    server.wait(timeout=20)
    began = time.monotonic()
    proc = wait_ready(port, "--pid", str(server.pid), "--timeout", "60")
    assert proc.returncode == 1 and f"main process {server.pid} is not running" in proc.stderr
    assert time.monotonic() - began < 60, "no waiting for the full timeout on a dead process"


def test_never_healthy_times_out_with_progress(servers):
    port = free_port()
    server = servers(port, STANDIN_FAIL="health")
    proc = wait_ready(port, "--pid", str(server.pid), "--timeout", "3")
    assert proc.returncode == 1
    assert "waiting for readiness" in proc.stdout
    assert "not ready after 3 s" in proc.stderr and "/health_generate 503" in proc.stderr


def test_smoke_generate_and_server_info(servers):
    port = free_port()
    server = servers(port)
    url = f"http://127.0.0.1:{port}"
    assert readiness.wait_ready(lambda: server.pid, url, 20, print).ready
    assert readiness.smoke_generate(url, None) is None
    info = readiness.server_info(url, None)
    assert info["pid"] == server.pid and info["internal_states"][0]["avg_spec_accept_length"] > 1
    assert readiness.smoke_generate("http://127.0.0.1:1", None).startswith("smoke /generate answered no answer")


def test_without_root_the_owner_is_reported_unchecked_not_foreign(servers):
    port = free_port()
    server = servers(port)
    assert readiness.wait_ready(lambda: server.pid, f"http://127.0.0.1:{port}", 20, print).ready
    nobody = NobodyTree()
    try:
        proc = nobody.run(["-m", "k26_ddtree", "wait-ready", "--url", f"http://127.0.0.1:{port}",
                           "--pid", str(server.pid), "--timeout", "5"], timeout=60)
    finally:
        nobody.remove()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"owner not checked: run as root to tie it to pid {server.pid}" in proc.stdout


def test_sigterm_unwinds_a_wait_like_ctrl_c():
    """systemd stops ExecStartPost with SIGTERM: the wait ends at once, as an interruption, not a crash."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26_ddtree", "wait-ready", "--pid", str(os.getpid()),
         "--url", f"http://127.0.0.1:{free_port()}", "--timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
    finally:
        proc.kill()
    assert proc.returncode == 130
    assert "k26-deploy: interrupted" in err
    assert "Traceback" not in err

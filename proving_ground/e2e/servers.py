"""The proving ground's servers: one SGLang process each, its HTTP calls, start, readiness and stop."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from k26_ddtree.processes import alive, descendants
from proving_ground import matrix

REQUEST_TIMEOUT_S = 300
STOP_TIMEOUT_S = 20
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# NVLink multicast stays off: the multi-GPU hosts it runs on do not offer it.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
# SGLang's KV pool check (pool_configurator.MemoryPoolConfig), failed when neighbours that started
# beside a server allocated while it profiled free memory around its weight load.
NO_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."


def say(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", flush=True)


@dataclass
class Server:
    spec: matrix.ServerSpec
    port: int
    log: Path
    proc: subprocess.Popen | None = None
    pid: int | None = None  # the server's process group; kept when an earlier run started it
    reused: bool = False
    status: str = "not started"
    launched_at: float = 0.0
    ready_s: float | None = None
    peak_mem_mib: int = 0
    pids: set = field(default_factory=set)
    retried_alone: bool = False  # its first start, beside its wave, found too little free memory
    traced: bool = False  # writes a tune trace (a group of the run that started it traces it)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and alive(self.pid)

    def exit_code(self):
        return self.proc.returncode if self.proc is not None else "unknown"


def post(url: str, payload: dict, timeout: float = REQUEST_TIMEOUT_S) -> bytes:
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with _OPENER.open(req, timeout=timeout) as resp:
        return resp.read()


def post_json(url: str, payload: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
    return json.loads(post(url, payload, timeout))


def get_json(url: str, timeout: float = 30) -> dict | None:
    try:
        with _OPENER.open(url, timeout=timeout) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError):
        return None


def launch(server: Server, python: str, models: Path, settings: dict, env: dict) -> None:
    cmd = [python] + matrix.server_command(server.spec, models, server.port, settings)
    server.log.parent.mkdir(parents=True, exist_ok=True)
    with open(server.log, "w") as log:
        log.write("$ " + " ".join(cmd) + "\n")
        log.flush()
        # cwd outside any checkout: `python -m` puts the cwd first on sys.path, and a source tree
        # there would shadow the site's packages.
        server.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=server.log.parent,
                                       start_new_session=True)
    server.pid = server.proc.pid
    server.status = "starting"
    server.launched_at = time.time()


def stop_group(pid: int, alive) -> None:
    """SIGTERM a server's process group, SIGKILL it after STOP_TIMEOUT_S (sglang drains without a deadline)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            return
        until = time.time() + STOP_TIMEOUT_S
        while alive() and time.time() < until:
            time.sleep(0.2)
        if not alive():
            return


def stop(server: Server) -> None:
    if server.alive():
        stop_group(server.pid, server.alive)


def in_parallel(calls) -> None:
    """Run the zero-argument callables at once and wait for all (stops and probes of many servers)."""
    threads = [threading.Thread(target=call, daemon=True) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# A server logs its model's load within its first lines; the rest of a long log is requests.
LOAD_LINES_BYTES = 4 << 20


def log_head(path: Path, max_bytes: int) -> str:
    """The first max_bytes of a log ("" where there is none)."""
    try:
        with path.open("rb") as f:
            return f.read(max_bytes).decode(errors="replace")
    except OSError:
        return ""


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def wait_ready(server: Server, timeout: float) -> None:
    """Block until the server answers /health_generate (or dies / times out); ready_s counts from its launch."""
    from k26_ddtree.deploy.readiness import wait_ready as deploy_wait_ready

    probe = deploy_wait_ready(lambda: server.pid if server.alive() else -1, server.url, timeout,
                              say=lambda m: None, interval=2.0)
    if probe.ready:
        server.status = "ready"
        server.ready_s = round(time.time() - server.launched_at, 1)
        server.pids = {server.pid} | descendants(server.pid)
        say(f"{server.spec.name} ready after {server.ready_s} s")
    else:
        server.status = f"failed to start ({probe.state}: {probe.detail})"
        say(f"{server.spec.name} {server.status}\n{log_tail(server.log)}")


def warm_sampling(server: Server) -> None:
    """One short temperature request, so the sampling kernels are compiled before anything is timed."""
    try:
        post_json(server.url + "/generate", {"input_ids": [3, 4, 5], "sampling_params": {
            "max_new_tokens": 16, "temperature": 0.7, "top_p": 0.95, "ignore_eos": True}})
    except (OSError, ValueError) as err:
        say(f"{server.spec.name}: sampling warm-up failed: {type(err).__name__}: {err}")


class MemorySampler(threading.Thread):
    """Peak GPU memory per server: nvidia-smi's per-process usage summed over each server's process tree."""

    def __init__(self, servers: list[Server], interval: float = 2.0):
        super().__init__(daemon=True)
        self.servers, self.interval = servers, interval
        self.stop_event = threading.Event()
        self.total_peak_mib = 0

    def run(self) -> None:
        while not self.stop_event.wait(self.interval):
            try:
                out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                      "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=20)
                total = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                       capture_output=True, text=True, timeout=20)
            except (OSError, subprocess.TimeoutExpired):
                continue
            usage = {}
            for line in out.stdout.splitlines():
                parts = [p.strip() for p in line.split(",")]
                if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                    usage[int(parts[0])] = int(parts[1])
            for server in self.servers:
                if server.alive():
                    server.pids |= {server.pid} | descendants(server.pid)
                    mine = sum(mib for pid, mib in usage.items() if pid in server.pids)
                    server.peak_mem_mib = max(server.peak_mem_mib, mine)
            first = total.stdout.strip().splitlines()[:1]
            if first and first[0].strip().isdigit():
                self.total_peak_mib = max(self.total_peak_mib, int(first[0].strip()))


class Stagger:
    """Serialises launches with a pause: every server profiles free memory around its weight
    load, and a neighbour allocating inside that window would shrink (or negate) its KV budget.
    The pause spaces the launches, not the windows: each comes some 35 s into its start (session
    9), and waiting out every window in turn would add that to each server of a wave. A start the
    window caught is tried again alone instead (MatrixRun.start_alone)."""

    def __init__(self, seconds: float):
        self.seconds, self.lock = seconds, threading.Lock()

    def launch(self, server: Server, python: str, models: Path, settings: dict, env: dict) -> None:
        with self.lock:
            launch(server, python, models, settings, env)
            time.sleep(self.seconds)

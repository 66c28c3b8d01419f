"""The GPU proving-ground runner: real sglang servers, one matrix run, one JSON + markdown table.

    python tests/gpu/e2e.py --matrix tests/gpu/matrix.json --run 1 \
        --site /tmp/k26/site --models /tmp/k26/models --out $OUT

The servers of a run share the one GPU (own port, small static memory fraction).
They start in two waves when the matrix names a first wave (its servers fill the
JIT caches the rest then load), its "last_wave" servers after all others, and
`-oracle` servers start once the `ar`
server's greedy outputs with top-2 log-probs, the reference, have become their
oracle file (K26_DDTREE_ORACLE), unless --oracle-file carries an earlier run's.
Then one workload at a time: each server's matrix cells (lossless against the
reference), or, in a speed run, the speed cells of k26_ddtree.gpu.speed. DDTree
servers run on a patched copy of the site (`python -m k26_ddtree apply
--sglang-dir COPY/sglang`); AR and DFLASH run on the pristine site. A run's matrix
"tunes" groups then trace, cost and tune (k26_ddtree.gpu.tuning). The report
is written by --deadline-s whatever happens.

Servers can outlive the run (--keep-for RUN: those a later run needs): a warm
machine keeps /tmp and session leaders between device calls, so the next run
reuses every server it finds alive, healthy and started from the same bundle,
code, models and settings (WORK/servers.json, written at every launch), pays
no start-up, and stops every other server it finds recorded there.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.gpu import lossless, matrix, profile, speed, tuning
from k26_ddtree.sglang.args import TRACE_ENV
from k26_ddtree.tune import schedule_file
from k26_ddtree.processes import alive, descendants

ORACLE_ENV = "K26_DDTREE_ORACLE"
REQUEST_TIMEOUT_S = 300
MIN_WORKLOAD_S = 15
STOP_TIMEOUT_S = 20
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))
# NVLink multicast stays off on the lent machines (device KINDS.md).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
_CAPTURE = re.compile(r"Capture (.+?) end\. Time elapsed: ([\d.]+) s")
_FATAL = re.compile(r"Traceback|CUDA error|CUBLAS_STATUS|illegal memory access|device-side assert|Segmentation fault")
# The bundle leaves out openai_harmony (OpenAI Responses API only): sglang logs that traceback and serves on.
_BENIGN = re.compile(r"Can not initialize OpenAIServingResponses")
# SGLang's KV pool check (pool_configurator.MemoryPoolConfig), failed when neighbours that started
# beside a server allocated while it profiled free memory around its weight load.
_NO_MEMORY = "Not enough memory. Please try to increase --mem-fraction-static."


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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return self.pid is not None and alive(self.pid)

    def exit_code(self):
        return self.proc.returncode if self.proc is not None else "unknown"


# --- http ----------------------------------------------------------------------------------------

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


# --- processes -----------------------------------------------------------------------------------

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


# --- workloads -----------------------------------------------------------------------------------

def run_workload(server: Server, workload: dict, prompts: list[list[int]], new_tokens: int, want_logprobs: bool,
                 deadline: float):
    """Send the workload's requests; returns (results in prompt order, wall seconds)."""
    concurrency = int(workload["concurrency"])
    count = max(concurrency, len(prompts))
    jobs = [(i % len(prompts), prompts[i % len(prompts)], ramp_tokens(workload, new_tokens, i, count))
            for i in range(count)]

    def one(job):
        index, ids, tokens = job
        payload = {"input_ids": ids, "sampling_params": speed.sampling_params(workload, tokens)}
        if want_logprobs:
            payload.update(return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=False)
        try:
            out = post_json(server.url + "/generate", payload, timeout=max(5.0, min(REQUEST_TIMEOUT_S,
                                                                                    deadline - time.time())))
        except (OSError, ValueError, http.client.HTTPException) as err:
            return {"prompt": index, "error": f"{type(err).__name__}: {err}"}
        meta = out.get("meta_info", {})
        ids_out = out.get("output_ids")
        if ids_out is None:
            return {"prompt": index, "error": "response has no output_ids"}
        result = {"prompt": index, "output_ids": ids_out, "max_new_tokens": tokens,
                  "meta": {k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length",
                                                    "e2e_latency")}}
        if want_logprobs:
            result["top2"] = [[[row[0], row[1]] for row in (pos or [])[:2]]
                              for pos in meta.get("output_top_logprobs") or []]
        return result

    t = time.time()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, jobs))
    return results, time.time() - t


def ramp_tokens(workload: dict, new_tokens: int, i: int, count: int) -> int:
    """Request i's new tokens: all alike, or on a "ramp" workload (i + 1) / count of them, so the
    batch shrinks request by request through every batch size below its concurrency (the way a
    schedule's buckets are crossed between steps)."""
    return max(1, new_tokens * (i + 1) // count) if workload.get("ramp") else new_tokens


def cell_record(server: Server, wname: str, workload: dict, results, wall: float, reference, eps: float) -> dict:
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    tokens = sum(len(r["output_ids"]) for r in ok)
    cell = {"server": server.spec.name, "workload": wname, "requests": len(results), "errors": errors[:3],
            "error_count": len(errors), "tokens": tokens, "wall_s": round(wall, 2),
            "tok_per_s": round(tokens / wall, 1) if wall > 0 else None,
            "accept_length": lossless.acceptance([r["meta"] for r in ok]) if server.spec.speculative else None}
    if float(workload["temperature"]) == 0.0 and reference is not None:
        divs = lossless.divergences(((r["prompt"], r["output_ids"], r["max_new_tokens"]) for r in ok), reference,
                                    eps)
        cell["divergences"] = [d.as_dict() for d in divs]
        cell["verdict"] = "FAIL" if errors else lossless.verdict(divs)
    else:
        cell["verdict"] = "completed" if not errors and tokens else "FAIL"
    return cell


# --- patched site --------------------------------------------------------------------------------

def patched_site(site: Path, work: Path, python: str, log: Path) -> tuple[Path | None, str]:
    """A copy of the site (under `work`) with the DDTree patch set applied; (None, why) when that fails."""
    dest = work / "site-ddtree"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(site, dest, symlinks=True)
    env = dict(os.environ, PYTHONPATH=str(dest), **SAFE_ENV)
    proc = subprocess.run([python, "-m", "k26_ddtree", "apply", "--sglang-dir", str(dest / "sglang")],
                          capture_output=True, text=True, env=env, cwd=work, timeout=300)
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        return None, f"patch set apply failed (exit {proc.returncode}): {(proc.stderr or proc.stdout).strip()[-300:]}"
    return dest, "applied"


# --- report --------------------------------------------------------------------------------------

def capture_seconds(log: Path) -> float | None:
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return None
    found = [float(m.group(2)) for m in _CAPTURE.finditer(text)]
    return round(sum(found), 1) if found else None


def fatal_lines(log: Path) -> list[str]:
    try:
        return [ln.strip()[:200] for ln in log.read_text(errors="replace").splitlines()
                if _FATAL.search(ln) and not _BENIGN.search(ln)][:5]
    except OSError:
        return []


def markdown(report: dict) -> str:
    lines = [f"# GPU proving ground, run {report['run']}",
             "", f"{report['device']}; {report['new_tokens']} new tokens x {report['prompts']} prompts; "
             f"eps {report['eps']}; AR reference top-2 gap: {report.get('reference_gaps')}",
             f"total wall {report['wall_s']} s; GPU memory peak (all servers) {report['gpu_peak_mib']} MiB", "",
             "| server | workload | verdict | accept len | tok/s | divergences (pos: gap) | start s | capture s | peak MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in report["servers"]:
        if not s["cells"]:
            lines.append(f"| {s['name']} | - | {s['status']} | | | | {s['ready_s']} | {s['capture_s']} | "
                         f"{s['peak_mem_mib']} |")
        for c in s["cells"]:
            shown = c.get("divergences", [])
            divs = ", ".join(f"p{d['prompt']}@{d['position']}: {d['gap'] if d['gap'] is None else round(d['gap'], 3)}"
                             for d in shown[:6]) + (f" (+{len(shown) - 6} more in the JSON)" if len(shown) > 6 else "")
            acc = "" if c["accept_length"] is None else f"{c['accept_length']:.2f}"
            lines.append(f"| {s['name']} | {c['workload']} | {c['verdict']} | {acc} | {c['tok_per_s']} | {divs} | "
                         f"{s['ready_s']} | {s['capture_s']} | {s['peak_mem_mib']} |")
    lines += ["", f"Overall: **{report['overall']}**", ""]
    return "\n".join(lines)


def gpu_name() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30).stdout.strip() or "unknown GPU"
    except (OSError, subprocess.TimeoutExpired):
        return "no nvidia-smi"


def overall(servers_out: list[dict], speed_cells: list[dict] = (), idle: set[str] = frozenset()) -> str:
    """PASS, FAIL (what failed) or INCOMPLETE (what was skipped or cut): a skipped server is not a pass.
    `idle` servers are started (and checked) by this run but serve their cells in a later one."""
    bad, skipped = [], []
    measured = {c["server"] for c in speed_cells if c["repeats"]} | set(idle)
    for s in servers_out:
        if s["status"].startswith("skipped"):
            skipped.append(s["name"])
        elif s["status"] not in ("stopped", "kept running"):
            bad.append(f"{s['name']}: {s['status']}")
        elif not s["cells"] and s["name"] not in measured:
            bad.append(f"{s['name']}: served no workload")
        bad += [f"{s['name']}/{c['workload']}: {c['verdict']}" for c in s["cells"] if c["verdict"] == "FAIL"]
    bad += [f"{c['server']}/{c['cell']}: speed FAIL" for c in speed_cells if c["verdict"] == "FAIL"]
    skipped += [f"{c['server']}/{c['cell']} ({c['note']})" for c in speed_cells if c["note"]]
    if bad:
        return "FAIL (" + "; ".join(bad) + ")"
    return "INCOMPLETE (skipped: " + ", ".join(skipped) + ")" if skipped else "PASS"


def write_outputs(out: Path, report: dict, logs: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_text(out / f"e2e-run{report['run']}.json", json.dumps(report, indent=1) + "\n")
    atomic.write_text(out / f"e2e-run{report['run']}.md", markdown(report))
    with tarfile.open(out / f"logs-run{report['run']}.tar.xz", "w:xz") as tar:
        tar.add(logs, arcname=f"logs-run{report['run']}")


# --- oracle --------------------------------------------------------------------------------------

def write_oracle(path: Path, prompts: list[list[int]], reference: dict, seed: int, rank_policy: str) -> None:
    oracle = {"seed": seed, "rank_policy": rank_policy,
              "prompts": [{"input_ids": prompts[i], "ar_output_ids": reference[i]["output_ids"]}
                          for i in range(len(prompts))]}
    atomic.write_text(path, json.dumps(oracle) + "\n")


def oracle_agreement(carried: Path, reference: dict) -> dict:
    """How far a carried oracle file's AR outputs agree with this run's AR (acceptance only, never correctness)."""
    rows = json.loads(carried.read_text())["prompts"]
    firsts = [lossless.first_divergence(row["ar_output_ids"], reference[i]["output_ids"])
              for i, row in enumerate(rows) if i in reference]
    return {"prompts_identical": sum(f is None for f in firsts),
            "first_divergences": [f for f in firsts if f is not None]}


# --- reuse across device calls ---------------------------------------------------------------------

# Settings that change only how the runner waits for servers, not what a server is.
HARNESS_SETTINGS = ("ready_timeout_s", "launch_stagger_s")


def fingerprint(site: Path, models: Path, settings: dict) -> str:
    """What a reused server must share with this run: the installed bundle and the k26_ddtree
    it runs, the model pair and the server settings."""
    served = {k: v for k, v in settings.items() if k not in HARNESS_SETTINGS}
    digest = hashlib.sha256(json.dumps(served, sort_keys=True).encode())
    for path in [site / ".k26-bundle", *sorted((site / "k26_ddtree").rglob("*.py"))]:
        if path.is_file():
            digest.update(str(path.relative_to(site)).encode() + path.read_bytes())
    for name in (".k26-model", "train_report.json", "prompts.json"):
        if (models / name).is_file():
            digest.update((models / name).read_bytes())
    return digest.hexdigest()


def read_state(state: Path, expected: str) -> dict:
    """{name: {"port", "pid", "launched_at", "keep"}} of the servers an earlier run kept for
    this code, models and settings. Every other recorded server is stopped: kept for something
    else, or left behind by a run that was killed, it holds GPU memory and a port, and nothing
    can use it."""
    try:
        recorded = json.loads(state.read_text())
    except (OSError, ValueError):
        return {}
    servers = recorded.get("servers", {})
    usable = recorded.get("fingerprint") == expected
    stale = {n: e for n, e in servers.items() if not (usable and e.get("keep"))}
    for name, entry in stale.items():
        say(f"stopping {name} (pid {entry['pid']}): " + ("left by a killed run" if usable else
                                                          "kept by a run of other code, models or settings"))
    in_parallel(lambda pid=int(e["pid"]): stop_group(pid, lambda: alive(pid)) for e in stale.values())
    return {n: e for n, e in servers.items() if n not in stale}


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


# --- the run ---------------------------------------------------------------------------------------

class MatrixRun:
    """One proving-ground run, phase by phase: start, reference, cells or speed, extras, report."""

    def __init__(self, args):
        for name in ("matrix", "site", "models", "out", "work", "jit_dir", "patched_site", "oracle_file"):
            if getattr(args, name) is not None:
                setattr(args, name, getattr(args, name).resolve())
        self.args = args
        self.t0 = time.time()
        self.deadline = self.t0 + args.deadline_s
        self.spec = matrix.load(args.matrix)
        names = self.spec["runs"].get(str(args.run))
        if names is None:
            raise UserError(f"matrix {args.matrix} has no run {args.run!r} (runs: {', '.join(self.spec['runs'])})")
        if args.only:
            names = [n for n in names if n in args.only or n == "ar"]
        self.is_speed = str(args.run) in self.spec.get("speed_runs", [])
        self.settings = dict(self.spec["server"], **self.spec.get("run_settings", {}).get(str(args.run), {}))
        # A run may generate fewer tokens per request (its speed repeats then end sooner).
        self.spec["new_tokens"] = int(self.settings.get("new_tokens", self.spec["new_tokens"]))
        try:
            prompts_doc = json.loads((args.models / "prompts.json").read_text())
            self.prompts = [p["input_ids"] for p in prompts_doc["prompts"]][: self.spec["prompts"]]
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise UserError(f"{args.models}/prompts.json is missing or not the model pair's prompts ({err}); "
                            "make the pair with `python -m k26_ddtree.gpu.train --out DIR`") from None
        unknown = [run for run in args.keep_for if run not in self.spec["runs"]]
        if unknown:
            raise UserError(f"--keep-for {unknown[0]}: no such run in {args.matrix} (runs: {', '.join(self.spec['runs'])})")
        if args.oracle_file is not None and not args.oracle_file.is_file():
            raise UserError(f"--oracle-file {args.oracle_file}: no such file")
        self.logs = args.work / "logs"
        # Every name and schedule checked before OUT and WORK are made: a mistake leaves nothing behind.
        given, chains = named_schedules(args.schedule)
        self.schedules = dict(self.spec.get("schedules", {}), **given)
        self.not_started = {n: f"the tune file of schedule {matrix.schedule_name(n)!r} chose the plain chain at every "
                               "concurrency: the run's DFLASH server serves that" for n in names
                            if matrix.schedule_name(n) in chains}
        names = [n for n in names if n not in self.not_started]
        self.servers = [Server(matrix.parse_server(n, self.schedules), 0, self.logs / f"{n}.log") for n in names]
        self.tunes, self.tune_notes = tuning.groups(self.spec, str(args.run), names)
        self.tunes, kept_notes = tuning.with_kept_traces(self.tunes, args.work, time.time())
        self.tune_notes += kept_notes
        args.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.state = args.work / "servers.json"
        self.oracle_path = args.work / "oracle.json"
        self.carried_oracle = args.oracle_file
        self.envs: dict[str, dict] = {}
        self.previous: dict[str, dict] = {}  # servers earlier runs kept for other runs
        self.reference: dict | None = None
        self.ref_rows: list = []
        self.cells: dict[str, list] = {s.spec.name: [] for s in self.servers}
        self.speed: list[dict] = []
        self.stagger = Stagger(float(self.settings.get("launch_stagger_s", 0)))
        self.sampler = MemorySampler(self.servers)
        self.fingerprint = fingerprint(args.site, args.models, self.settings)

    def time_left(self) -> float:
        return self.deadline - time.time()

    def ready_timeout(self) -> float:
        return max(1.0, min(float(self.settings["ready_timeout_s"]), self.time_left() - MIN_WORKLOAD_S))

    def run(self) -> dict:
        for name, why in self.not_started.items():
            say(f"{name}: not started; {why}")
        for note in self.tune_notes:
            say(note)
        self.sampler.start()
        try:
            self.start_servers()
            self.take_reference()
            if not self.is_speed:
                self.serve_cells()
            self.stop_sampling()
            if self.is_speed:
                self.measure_speed()
            self.run_extras()
        finally:
            report = self.finish()
        return report

    # start --------------------------------------------------------------------------------------
    def start_servers(self) -> None:
        """Reuse what an earlier run kept, launch the rest (first wave, then the others; -oracle
        servers wait for the reference), and wait until every launched server is ready."""
        kept = read_state(self.state, self.fingerprint)
        self.previous = {n: e for n, e in kept.items() if n not in {s.spec.name for s in self.servers}}
        used_ports = {int(k["port"]) for k in kept.values()}
        port = self.args.base_port
        to_launch = []
        tracing = [group for group in self.tunes if group.trace]
        traced = {group.trace for group in tracing}
        for group in tracing:
            # Whatever this run's trace server does not write is no trace of this run.
            group.trace_file(self.args.work).unlink(missing_ok=True)
        for server in self.servers:
            old = kept.get(server.spec.name)
            if old and server.spec.name in traced:
                # A kept server writes no trace, or an earlier run's: start it anew, tracing.
                say(f"{server.spec.name}: traced in this run, so the kept one is stopped and started anew")
                server.port, server.pid = int(old["port"]), int(old["pid"])
                stop(server)
                server.pid = None
            elif old and self.reuse(server, old):
                continue
            while port in used_ports:
                port += 1
            server.port, port = port, port + 1
            to_launch.append(server)
        self.prepare_envs(to_launch)
        to_launch = [s for s in to_launch if s.spec.name in self.envs]
        if self.carried_oracle:
            shutil.copyfile(self.carried_oracle, self.oracle_path)
        else:
            self.oracle_path.unlink(missing_ok=True)
        first = set(self.spec.get("first_wave", []))
        now = [s for s in to_launch if not self.waits_for_reference(s)]
        wave1 = [s for s in now if s.spec.name in first]
        self.record_state()
        self.launch_and_wait(wave1)
        # The first sampling request of a process compiles flashinfer's sampling kernels
        # (about 100 s): the first wave pays it once, into the shared cache, while the rest start.
        warmers = [threading.Thread(target=warm_sampling, args=(s,), daemon=True) for s in wave1 if s.status == "ready"]
        for t in warmers:
            t.start()
        last = set(self.spec.get("last_wave", []))
        self.launch_and_wait([s for s in now if s.spec.name not in first | last])
        # SGLang sizes a server's pool from the memory free while it starts: one started beside
        # several others of a 12 GB model can find too little (bench/results/gpu-session5).
        self.launch_and_wait([s for s in now if s.spec.name in last - first])
        for t in warmers:
            t.join(timeout=max(1.0, self.time_left() - MIN_WORKLOAD_S))
        reused = [s.spec.name for s in self.servers if s.reused]
        say(f"servers ready: {sum(s.status == 'ready' for s in self.servers)}; reused from an earlier run: "
            f"{', '.join(reused) or 'none'}")

    def reuse(self, server: Server, old: dict) -> bool:
        server.port, server.pid = int(old["port"]), int(old["pid"])
        if server.alive() and get_json(server.url + "/server_info", timeout=10) is not None:
            server.reused, server.status = True, "ready"
            server.launched_at, server.ready_s = float(old.get("launched_at", 0)), 0.0
            server.pids = {server.pid} | descendants(server.pid)
            return True
        say(f"{server.spec.name}: the kept server (pid {server.pid}) does not answer; stopping it, starting anew")
        stop(server)
        server.pid = None
        return False

    def record_state(self, keep: set[str] | None = None) -> None:
        """WORK/servers.json: every live server of this run and what earlier runs kept, so that a
        later run reuses the kept ones and stops the rest, even when this run is killed before its
        end. keep: the servers kept at the end; None while the run goes on, when a server reused
        from a keeping run stays kept and one launched by this run is not yet."""
        mine = {s.spec.name: {"port": s.port, "pid": s.pid, "launched_at": s.launched_at,
                              "keep": s.reused if keep is None else s.spec.name in keep}
                for s in self.servers if s.pid is not None and s.alive()}
        atomic.write_text(self.state, json.dumps({"fingerprint": self.fingerprint,
                                                  "servers": {**self.previous, **mine}}, indent=1) + "\n")

    def waits_for_reference(self, server: Server) -> bool:
        return server.spec.oracle and self.carried_oracle is None

    def prepare_envs(self, to_launch: list[Server]) -> None:
        args = self.args
        base_env = dict(os.environ, **SAFE_ENV, PYTHONUNBUFFERED="1",
                        TRITON_CACHE_DIR=str(args.jit_dir / "triton"), TVM_FFI_CACHE_DIR=str(args.jit_dir / "tvm-ffi"),
                        FLASHINFER_WORKSPACE_BASE=str(args.jit_dir / "flashinfer"),
                        TORCHINDUCTOR_CACHE_DIR=str(args.jit_dir / "inductor"))
        base_env.pop(ORACLE_ENV, None)
        ddtree_site, why = None, ""
        previous = args.work / "site-ddtree"
        if args.patched_site:
            ddtree_site, why = args.patched_site, "given with --patched-site"
        elif previous.is_dir() and any(s.reused and s.spec.algo == "DDTREE" for s in self.servers):
            # Reused servers run from it: copying it anew would pull the files from under them.
            ddtree_site, why = previous, "the one the reused servers run from"
        elif any(s.spec.algo == "DDTREE" for s in to_launch):
            say("applying the DDTree patch set to a copy of the site")
            ddtree_site, why = patched_site(args.site, args.work, args.python, self.logs / "apply.log")
            say(f"patch set: {why}")
        for server in to_launch:
            if server.spec.algo == "DDTREE" and ddtree_site is None:
                server.status = f"skipped: {why}"
                continue
            site = ddtree_site if server.spec.algo == "DDTREE" else args.site
            self.envs[server.spec.name] = dict(base_env, PYTHONPATH=str(site))
            for group in self.tunes:
                if server.spec.name == group.trace:
                    self.envs[server.spec.name][TRACE_ENV] = str(group.trace_file(args.work))
            if server.spec.oracle:
                self.envs[server.spec.name][ORACLE_ENV] = str(self.oracle_path)

    def launch_and_wait(self, wave: list[Server]) -> None:
        if not wave:
            return
        for server in wave:
            self.stagger.launch(server, self.args.python, self.args.models, self.settings, self.envs[server.spec.name])
        self.record_state()
        say(f"launched {', '.join(s.spec.name for s in wave)}")
        timeout = self.ready_timeout()
        in_parallel(lambda s=s: wait_ready(s, timeout) for s in wave)
        if len(wave) > 1:
            crowded = [s for s in wave if s.status.startswith("failed") and _NO_MEMORY in log_tail(s.log, 60)]
            # A start takes about as long as its wave's slowest did.
            start_s = max(s.ready_s or 0.0 for s in wave)
            for server in crowded:
                self.start_alone(server, start_s)

    def start_alone(self, server: Server, start_s: float) -> None:
        """Once more, now that its wave has settled (session 9 lost b16/k4 to three neighbours
        loading beside it: bench/results/gpu-session9); the first start's log is kept beside."""
        if self.time_left() < start_s + MIN_WORKLOAD_S:
            say(f"{server.spec.name}: too little time left to start it again alone (a start took {start_s:.0f} s)")
            return
        # A dead leader can leave children that hold the port and GPU memory.
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        server.log.replace(server.log.with_name(server.log.stem + ".crowded.log"))
        say(f"{server.spec.name} found too little free GPU memory, possibly because others of its wave loaded "
            "meanwhile: starting it again, alone")
        server.retried_alone = True
        self.stagger.launch(server, self.args.python, self.args.models, self.settings, self.envs[server.spec.name])
        self.record_state()
        wait_ready(server, self.ready_timeout())

    # reference ----------------------------------------------------------------------------------
    def take_reference(self) -> None:
        """AR greedy-c1 with top-2 log-probs: the reference of every greedy cell and the oracle file;
        then the -oracle servers start."""
        ar = next(s for s in self.servers if s.spec.name == "ar")
        if ar.status == "ready":
            workload = self.spec["workloads"]["greedy-c1"]
            results, wall = run_workload(ar, workload, self.prompts, self.spec["new_tokens"], True, self.deadline)
            rows = [r for r in results if "error" not in r]
            cell = cell_record(ar, "greedy-c1", workload, results, wall, None, self.spec["eps"])
            if len(rows) == len(self.prompts):
                self.reference = {r["prompt"]: r for r in rows}
                self.ref_rows = rows
                cell["verdict"] = "reference"
                path = self.args.out / f"oracle-run{self.args.run}.json"
                write_oracle(path, self.prompts, self.reference, self.args.seed, self.args.rank_policy)
                if self.carried_oracle is None:
                    shutil.copyfile(path, self.oracle_path)
            else:
                say("AR reference incomplete: greedy cells cannot be judged")
            self.cells["ar"].append(cell)
        waiting = [s for s in self.servers if s.spec.name in self.envs and self.waits_for_reference(s)]
        if self.reference is None:
            for server in waiting:
                server.status = "skipped: no AR reference for the oracle file"
            return
        self.launch_and_wait(waiting)

    # cells --------------------------------------------------------------------------------------
    def serve_cells(self) -> None:
        """Each server's matrix workloads, one workload on the GPU at a time; greedy cells are judged
        against the reference (the AR server's own c16 against its c1)."""
        only = self.spec.get("run_cells", {}).get(str(self.args.run))
        for server in self.servers:
            if only is not None and server.spec.name not in only:
                continue
            names = self.spec.get("run_workloads", {}).get(str(self.args.run), {}).get(server.spec.name) or (
                self.spec["spec_workloads"] if server.spec.speculative else self.spec["ar_workloads"])
            for wname in names:
                if server.spec.name == "ar" and wname == "greedy-c1":
                    continue
                if server.status != "ready":
                    break
                if self.time_left() < MIN_WORKLOAD_S:
                    server.status = f"cut off at the run deadline before {wname}"
                    break
                workload = self.spec["workloads"][wname]
                results, wall = run_workload(server, workload, self.prompts, self.spec["new_tokens"], False,
                                             self.deadline)
                cell = cell_record(server, wname, workload, results, wall, self.reference, self.spec["eps"])
                self.cells[server.spec.name].append(cell)
                say(f"{server.spec.name} {wname}: {cell['verdict']} tok/s {cell['tok_per_s']} "
                    f"accept {cell['accept_length']}")
                if not server.alive():
                    server.status = f"crashed during {wname} (exit {server.exit_code()})"

    def stop_sampling(self) -> None:
        # Every measurement (the speed table, tune's costs, bench, profiles) runs without the memory
        # sampler: two nvidia-smi starts every two seconds are noise in host-bound steps, the peaks
        # are known once the cells have run, and costs must be measured as the table they predict.
        # Joined, so that no nvidia-smi still running overlaps the first measurement.
        self.sampler.stop_event.set()
        self.sampler.join(timeout=45)
        if self.sampler.is_alive():
            say("the memory sampler's nvidia-smi still runs after 45 s")

    def measure_speed(self) -> None:
        skip = set(self.spec["speed"].get("skip", {}).get(str(self.args.run), []))
        ready = [s for s in self.servers if s.status == "ready" and s.spec.name not in skip]
        spec = speed.SpeedSpec.from_matrix(self.spec, self.args.run)
        table_groups = [group for group in self.tunes if group.trace_from]
        # What the report still needs: stopping kept servers is not needed, the rest is quick; and
        # a table group's costs are worth nothing unless its tune still runs after the table.
        table_end = self.deadline - 12 - tuning.TABLE_TUNE_S * len(table_groups)
        table_costs = tuning.TableCosts(self.servers, table_groups, self.args, self.prompts, self.spec["new_tokens"],
                                        table_end, say) if table_groups else None
        self.speed = speed.measure(ready, spec, self.prompts, self.reference,
                                   lambda url, ids, params: post_json(url + "/generate",
                                                                      {"input_ids": ids, "sampling_params": params},
                                                                      timeout=max(5.0, self.time_left())),
                                   table_end, say, table_costs.after_round if table_costs else None)
        for server in ready:
            if not server.alive():
                server.status = f"crashed during the speed cells (exit {server.exit_code()})"

    def run_extras(self) -> None:
        if self.tunes:
            tuning.costs_and_tune(self.servers, self.tunes, self.args, self.prompts, self.spec["new_tokens"],
                                  self.deadline, say)
        if self.args.bench_server:
            run_bench_harness(self.servers, self.args, self.deadline)
        for name in self.args.profile_server:
            profile_server(self.servers, name, self.prompts, self.spec["new_tokens"], self.args, self.deadline)

    # report -------------------------------------------------------------------------------------
    def finish(self) -> dict:
        """Server info, stop what no later run needs (or keep it, recorded in WORK/servers.json),
        and write the report."""
        keep = {n for run in self.args.keep_for for n in self.spec["runs"][run]}
        accept = {}
        for s in self.servers:
            if s.status == "ready" and not s.alive():
                s.status = f"exited early (code {s.exit_code()})"

        def server_info(s: Server) -> None:
            info = get_json(s.url + "/server_info", timeout=5)
            if info:
                accept[s.spec.name] = (info.get("internal_states") or [{}])[0].get("avg_spec_accept_length")

        in_parallel(lambda s=s: server_info(s) for s in self.servers if s.status == "ready")
        self.stop_sampling()
        in_parallel(lambda s=s: stop(s) for s in self.servers if not (s.spec.name in keep and s.status == "ready"))
        for s in self.servers:
            if s.status == "ready":
                s.status = "kept running" if s.spec.name in keep and s.alive() else "stopped"
        self.record_state(keep)
        report = self.report(accept)
        write_outputs(self.args.out, report, self.logs)
        if self.is_speed:
            spec = speed.SpeedSpec.from_matrix(self.spec, self.args.run)
            baseline = next((s.spec.name for s in self.servers if s.spec.algo == "DFLASH"), "ar")
            atomic.write_text(self.args.out / f"speed-run{self.args.run}.md", speed.markdown(
                str(self.args.run), self.speed, baseline, spec, report["device"], len(self.prompts)))
        say(f"run {self.args.run}: {report['overall']} ({report['wall_s']} s)")
        return report

    def report(self, accept: dict) -> dict:
        servers_out = []
        for s in self.servers:
            servers_out.append({"name": s.spec.name, "algo": s.spec.algo, "budget": s.spec.budget, "topk": s.spec.topk,
                                "drafter": s.spec.drafter, "eager": s.spec.eager, "spine": s.spec.spine,
                                "tp": s.spec.tp, "ep": s.spec.ep,
                                "status": s.status, "reused": s.reused, "retried_alone": s.retried_alone,
                                "port": s.port, "ready_s": s.ready_s,
                                "capture_s": capture_seconds(s.log), "peak_mem_mib": s.peak_mem_mib,
                                "fatal_log_lines": fatal_lines(s.log),
                                "avg_spec_accept_length": accept.get(s.spec.name),
                                "cells": self.cells.get(s.spec.name, [])})
        report = {"run": str(self.args.run), "device": gpu_name(), "prompts": len(self.prompts),
                  "new_tokens": self.spec["new_tokens"], "eps": self.spec["eps"],
                  "wall_s": round(time.time() - self.t0, 1), "gpu_peak_mib": self.sampler.total_peak_mib,
                  "reference_gaps": lossless.gap_stats([r["top2"] for r in self.ref_rows]) if self.ref_rows else None,
                  "oracle_file": "carried" if self.carried_oracle else "this run's AR",
                  "servers": servers_out, "not_started": self.not_started}
        if self.is_speed:
            report["speed"] = self.speed
        for name in ("train_report", "acceptance"):
            path = self.args.models / f"{name}.json"
            if path.is_file():
                report[name] = json.loads(path.read_text())
        if self.carried_oracle and self.reference:
            report["carried_oracle_vs_this_ar"] = oracle_agreement(self.carried_oracle, self.reference)
        cells_here = self.spec.get("run_cells", {}).get(str(self.args.run))
        idle = set() if cells_here is None else {s.spec.name for s in self.servers} - set(cells_here)
        report["overall"] = overall(servers_out, self.speed, idle)
        return report


def named_schedules(items: list[str]) -> tuple[dict[str, str], set[str]]:
    """--schedule NAME=TEXT / NAME=@FILE (a tune schedule file) as {NAME: schedule text}, and the
    names whose tune file chose the plain chain at every concurrency: no DDTree server serves
    that (the server refuses a chain-only schedule), the run's DFLASH server is that config."""
    out, chains = {}, set()
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise UserError(f"--schedule {item!r}: expected NAME=SCHEDULE or NAME=@FILE")
        if not matrix.SCHEDULE_NAME.fullmatch(name):
            # Any other name no server name could ever refer to.
            raise UserError(f"--schedule {item!r}: NAME is a lowercase letter, then lowercase letters or digits "
                            "(server ddtree-sNAME-...)")
        if value.startswith("@"):
            tuned = schedule_file.read(Path(value[1:]))
            if tuned.schedule is None:
                chains.add(name)
                continue
            value = tuned.schedule
        out[name] = value
    return out, chains


def run_bench_harness(servers: list[Server], args, deadline: float) -> None:
    """`k26-deploy bench` (the users' harness) against the named live servers, one at a time,
    then its report; everything lands in OUT/bench-harness/."""
    out = args.out / "bench-harness"
    out.mkdir(parents=True, exist_ok=True)
    results = out / "bench-harness.json"
    log = out / "bench-harness.log"
    tuning.bench_servers(servers, args.bench_server, results, log,
                         ["--contexts", "60,512", "--concurrency", "1,8", "--output-len", "128", "--id-range",
                          "3:2000", "--seed", "0", "--quiet"], deadline - MIN_WORKLOAD_S, "bench harness", say)
    if results.exists():
        with log.open("a") as fh:
            subprocess.run([sys.executable, "-m", "k26_ddtree", "bench", "report", str(results), "--out", str(out)],
                           stdout=fh, stderr=subprocess.STDOUT, timeout=120)


PROFILE_STEPS = 16


def profile_server(servers: list[Server], item: str, prompts, new_tokens: int, args, deadline: float) -> None:
    """A torch-profiler trace of PROFILE_STEPS decode steps on a server, `NAME` (one greedy request) or
    `NAME@C` (C at once: an AR server's decode step then runs C tokens through the model, as a verify
    of C tokens per request does), summarised into OUT/profile-NAME[-cC].txt (k26_ddtree.gpu.profile)."""
    name, _, at = item.partition("@")
    concurrency = int(at) if at.isdigit() and int(at) > 0 else 1
    label = name if not at else f"{name}-c{concurrency}"
    server = next((s for s in servers if s.spec.name == name), None)
    if server is None or server.status != "ready" or deadline - time.time() < 60:
        say(f"profile: {item} not ready or no time left, skipped")
        return
    trace_dir = args.work / f"profile-{label}"
    shutil.rmtree(trace_dir, ignore_errors=True)
    trace_dir.mkdir(parents=True, exist_ok=True)
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": 0.0}
    try:
        # /start_profile answers with plain text, not JSON.
        post(server.url + "/start_profile", {"output_dir": str(trace_dir), "num_steps": PROFILE_STEPS,
                                                  "activities": ["CPU", "GPU"]}, timeout=60)
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            list(pool.map(lambda i: post_json(server.url + "/generate", {
                "input_ids": prompts[i % len(prompts)], "sampling_params": params}, timeout=120), range(concurrency)))
    except (OSError, ValueError) as err:
        say(f"profile {item}: {type(err).__name__}: {err}")
        return
    trace = None
    for _ in range(60):
        trace = profile.newest_trace(trace_dir)
        if trace is not None and time.time() - trace.stat().st_mtime > 2:
            break
        time.sleep(1)
    if trace is None:
        say(f"profile {item}: no trace was written")
        return
    report = profile.summarize(trace, PROFILE_STEPS)
    (args.out / f"profile-{label}.txt").write_text(report)
    say(f"profile {item}:\n" + "\n".join(report.splitlines()[:6]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="e2e.py", description=__doc__.split("\n")[0])
    parser.add_argument("--matrix", type=Path, required=True, help="tests/gpu/matrix.json")
    parser.add_argument("--run", required=True, help="which run of the matrix (its \"runs\" keys)")
    parser.add_argument("--site", type=Path, required=True, help="installed offline bundle (PYTHONPATH folder)")
    parser.add_argument("--models", type=Path, required=True, help="folder with target/, drafter/, prompts.json")
    parser.add_argument("--out", type=Path, required=True, help="where e2e-runN.json/.md and the logs tarball go")
    parser.add_argument("--work", type=Path, default=Path("/tmp/k26-e2e"), help="scratch: logs, oracle.json")
    parser.add_argument("--jit-dir", type=Path, default=Path("/tmp/k26-jit"), help="persisted JIT caches")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the servers")
    parser.add_argument("--base-port", type=int, default=31000)
    parser.add_argument("--only", action="append", help="restrict to these server names (ar always runs)")
    parser.add_argument("--seed", type=int, default=0, help="seed written into the oracle file")
    parser.add_argument("--rank-policy", default="mixed", help="rank policy written into the oracle file")
    parser.add_argument("--deadline-s", type=float, default=480.0,
                        help="wall seconds for the whole run: later work is cut off and reported, and the "
                        "report is always written (default 480)")
    parser.add_argument("--patched-site", type=Path, help="a site with the DDTree patch set already applied "
                        "(default: copy --site and run `python -m k26_ddtree apply` on the copy)")
    parser.add_argument("--oracle-file", type=Path, help="an earlier run's oracle-runN.json (same model): "
                        "lets -oracle servers start with the others instead of after this run's AR")
    parser.add_argument("--bench-server", action="append", default=[],
                        help="also run `k26-deploy bench` against this server once its cells are done "
                        "(repeatable; results in OUT/bench-harness/)")
    parser.add_argument("--profile-server", action="append", default=[],
                        help=f"also record and summarise a torch-profiler trace of {PROFILE_STEPS} decode steps "
                        "on this server, NAME or NAME@C for C requests at once (repeatable; OUT/profile-NAME.txt, "
                        "OUT/profile-NAME-cC.txt)")
    parser.add_argument("--schedule", action="append", default=[], metavar="NAME=SCHEDULE",
                        help="a batch-size schedule for ddtree-sNAME-... servers: its text, or @FILE for the "
                        "schedule of a `k26-deploy tune` file (repeatable; beside matrix.json \"schedules\")")
    parser.add_argument("--cost-seconds", type=float, default=3.0, metavar="S",
                        help="each cost repeat's closed loop lasts at least S seconds (bench --steady; default 3, "
                        "the speed table's repeat)")
    parser.add_argument("--cost-repeats", type=int, default=3, metavar="N",
                        help="each cost is the median of N rounds across the cost servers, one closed loop per "
                        "server and concurrency each (default 3, not the speed table's 5, so that seven cost "
                        "servers fit one device call beside the trace cells)")
    parser.add_argument("--keep-for", action="append", default=[], metavar="RUN",
                        help="leave running the servers matrix run RUN also starts, for a later device call on the "
                        "same warm machine to reuse (recorded in WORK/servers.json; repeatable)")
    args = parser.parse_args(argv)
    if args.cost_repeats < 1 or not args.cost_seconds > 0:
        parser.error("--cost-repeats must be >= 1 and --cost-seconds > 0")
    # The device command's `timeout` sends SIGTERM: unwind through run()'s finally, so servers are
    # recorded or stopped and the report is written.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        report = MatrixRun(args).run()
    except UserError as err:
        print(f"e2e: error: {err}", file=sys.stderr)
        return err.code
    return 0 if report["overall"] == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())

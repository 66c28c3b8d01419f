"""What a run adds beside its cells: named schedules, the users' bench harness, a profiler trace."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from k26_ddtree.errors import UserError
from k26_ddtree.tune import schedule_file
from proving_ground import matrix, profile, tuning
from proving_ground.e2e.servers import post, post_json, say, Server
from proving_ground.e2e.workloads import MIN_WORKLOAD_S


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
    of C tokens per request does), summarised into OUT/profile-NAME[-cC].txt (proving_ground.profile)."""
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

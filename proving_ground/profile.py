"""Where a decode step's time goes: SGLang's torch-profiler trace of a few steps, summarised.

The proving ground asks a live server for a trace (`/start_profile` with num_steps) while
one request decodes, then reduces the Chrome trace to what decides speculative-decoding
overhead: GPU kernel time and count, CUDA-graph launches, host synchronisations, and the
CPU operators that take the most wall time, all per decode step.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy")
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        trace = json.load(fh)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    return [e for e in events if e.get("ph") == "X" and "dur" in e]


def _top(totals: dict[str, list[float]], n: int, steps: int) -> list[str]:
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:n]
    return [f"  {t / steps:9.1f} us/step  {c / steps:7.1f} calls/step  {name[:110]}" for name, (t, c) in rows]


def summarize(path: Path, steps: int, top: int = 20) -> str:
    """A plain-text report of the trace at `path`, normalised by `steps` decode steps."""
    events = load_events(path)
    steps = max(1, steps)
    kernels = defaultdict(lambda: [0.0, 0])
    cpu_ops = defaultdict(lambda: [0.0, 0])
    runtime = defaultdict(lambda: [0.0, 0])
    first, last = None, None
    for e in events:
        cat, name, dur = e.get("cat", ""), e.get("name", ""), float(e["dur"])
        start = float(e["ts"])
        first = start if first is None else min(first, start)
        last = start + dur if last is None else max(last, start + dur)
        table = {"kernel": kernels, "cpu_op": cpu_ops, "cuda_runtime": runtime, "cuda_driver": runtime}.get(cat)
        if table is not None:
            table[name][0] += dur
            table[name][1] += 1
    kernel_us = sum(t for t, _ in kernels.values())
    kernel_n = sum(c for _, c in kernels.values())
    graph_launches = sum(c for n, (_, c) in runtime.items() if n.startswith("cudaGraphLaunch"))
    launches = sum(c for n, (_, c) in runtime.items() if n in LAUNCH_CALLS)
    sync_us = sum(t for n, (t, _) in runtime.items() if n.startswith(SYNC_CALLS))
    sync_n = sum(c for n, (_, c) in runtime.items() if n.startswith(SYNC_CALLS))
    span = (last - first) if first is not None else 0.0
    lines = [
        f"trace {path.name}: {len(events)} events over {span / 1000:.1f} ms, normalised by {steps} steps",
        f"wall per step            {span / steps:9.1f} us",
        f"GPU kernel time per step {kernel_us / steps:9.1f} us  ({kernel_n / steps:.1f} kernels per step)",
        f"eager kernel launches    {launches / steps:9.1f} per step; CUDA graph launches {graph_launches / steps:.1f} per step",
        f"host syncs and memcpys   {sync_n / steps:9.1f} per step, {sync_us / steps:.1f} us per step blocked",
        "top GPU kernels:",
        *_top(kernels, top, steps),
        "top CPU operators (inclusive time):",
        *_top(cpu_ops, top, steps),
        "top CUDA runtime calls:",
        *_top(runtime, 8, steps),
    ]
    return "\n".join(lines) + "\n"


def newest_trace(folder: Path) -> Path | None:
    traces = sorted(folder.rglob("*.json*"), key=lambda p: p.stat().st_mtime)
    return traces[-1] if traces else None

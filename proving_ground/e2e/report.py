"""The run's report: fatal log lines, capture times, the verdict, the markdown table and the files."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
from pathlib import Path

from k26_ddtree import atomic
from proving_ground.exact import divergence_text

_CAPTURE = re.compile(r"Capture (.+?) end\. Time elapsed: ([\d.]+) s")
_FATAL = re.compile(r"Traceback|CUDA error|CUBLAS_STATUS|illegal memory access|device-side assert|Segmentation fault")
# The bundle leaves out openai_harmony (OpenAI Responses API only): sglang logs that traceback and serves on.
_BENIGN = re.compile(r"Can not initialize OpenAIServingResponses")


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
             f"eps {report['eps']}, exact_eps {report.get('exact_eps')}; AR reference top-2 gap: {report.get('reference_gaps')}",
             f"total wall {report['wall_s']} s; GPU memory peak (all servers) {report['gpu_peak_mib']} MiB", "",
             "| server | workload | verdict | accept len | tok/s | divergences (pos: gap, exact) | start s | capture s | peak MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for s in report["servers"]:
        if not s["cells"]:
            lines.append(f"| {s['name']} | - | {s['status']} | | | | {s['ready_s']} | {s['capture_s']} | "
                         f"{s['peak_mem_mib']} |")
        for c in s["cells"]:
            shown = c.get("divergences", [])
            divs = ", ".join(f"p{d['prompt']}@{d['position']}: {divergence_text(d)}" for d in shown[:6])
            divs += f" (+{len(shown) - 6} more in the JSON)" if len(shown) > 6 else ""
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

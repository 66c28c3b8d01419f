"""Time and peak memory of `k26-deploy tune` on a synthetic trace of a given size.

    python bench/bench_tune.py --mb 1024            # the server's default trace cap, depth 7: 910 shapes
    python bench/bench_tune.py --mb 50 --keep DIR   # a smaller one, kept for a rerun

Writes a trace of draft depth 7 (block 8) whose drafter ranks the committed token first about
60 % of the time, and a bench sweep covering budgets 1-64, then runs tune over every shape as a
child process and prints its wall time, its peak RSS (the child's ru_maxrss) and its ETA lines.
"""

from __future__ import annotations

import argparse
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "tune"))

from tune_fixtures import bench_run, header, sweep_runs, write_results  # noqa: E402

from k26_ddtree.sglang.common import trace  # noqa: E402

DEPTH = 7
STEPS_PER_REQUEST = 200
BATCH = 64
ETA = re.compile(r"ETA (\d+[hms][\dms]*)")


def write_trace(path: Path, megabytes: float, seed: int = 0) -> int:
    """A trace of about `megabytes`, written batch by batch as a server at C = BATCH would; its steps."""
    size = trace.record_size(DEPTH)
    steps = int(megabytes * (1 << 20)) // size
    gen = torch.Generator().manual_seed(seed)
    done = 0
    with open(path, "wb") as out:
        out.write(trace.header_bytes(header(DEPTH)))
        request = 0
        while done < steps:
            batch = min(BATCH * STEPS_PER_REQUEST, steps - done)
            rows = -(-batch // BATCH)
            # BATCH requests decoding side by side, STEPS_PER_REQUEST steps each.
            ids = torch.arange(request, request + BATCH).repeat(rows)[:batch]
            numbers = torch.arange(rows).repeat_interleave(BATCH)[:batch]
            text = torch.randint(0, 1000, (batch, DEPTH + 1), generator=gen)
            tokens = torch.randint(1000, 2000, (batch, DEPTH, trace.TOPK), generator=gen)
            first = torch.rand(batch, DEPTH, generator=gen) < 0.6
            tokens[..., 0] = torch.where(first, text[:, :DEPTH], tokens[..., 0])
            logprobs = torch.log_softmax(torch.randn(batch, DEPTH, trace.TOPK, generator=gen) * 2, -1)
            logprobs = logprobs.sort(-1, descending=True).values
            accepted = first.long().cumprod(1).sum(1)
            committed = [text[i, :int(accepted[i]) + 1].tolist() for i in range(batch)]
            out.write(trace.pack_records(ids.tolist(), numbers.tolist(), text[:, 0].tolist(), tokens, logprobs,
                                         committed))
            request += BATCH
            done += batch
    return steps


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mb", type=float, default=1024, help="trace size in MB (default 1024)")
    parser.add_argument("--keep", type=Path, help="folder to write the trace and sweep to and keep (default: a temp one)")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-tune-"))
    folder.mkdir(parents=True, exist_ok=True)
    trace_path, costs_path = folder / "bench.trace", folder / "sweep.json"
    if not trace_path.exists():
        started = time.perf_counter()
        steps = write_trace(trace_path, args.mb)
        print(f"bench_tune: wrote {steps} steps ({trace_path.stat().st_size / (1 << 20):.0f} MB) in "
              f"{time.perf_counter() - started:.0f} s", flush=True)
    if not costs_path.exists():
        write_results(costs_path, sweep_runs(budgets=(1, 8, 16, 32, 64))
                      + [bench_run(lambda ctx, c: 0.020 + 0.0001 * c, algorithm="DFLASH")])
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "k26_ddtree", "tune", "--trace", str(trace_path), "--costs",
                              str(costs_path), "--min-budget", "1", "--max-budget", "64", "--out",
                              str(folder / "plan.json")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
    lines = [(time.perf_counter() - started, line.rstrip()) for line in child.stderr]
    took = time.perf_counter() - started
    failed = child.wait()
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # counted once the child is reaped
    if failed:
        print("\n".join(line for _, line in lines), file=sys.stderr)
        return child.returncode
    shapes = next((line for _, line in lines if "tree shapes" in line), "")
    print(f"bench_tune: {shapes.removeprefix('tune: ')}")
    print(f"bench_tune: trace {trace_path.stat().st_size / (1 << 20):.0f} MB, tune took {took:.1f} s, "
          f"peak RSS {peak:.0f} MB")
    for at, line in lines:
        match = ETA.search(line)
        if match:
            predicted = at + _seconds(match.group(1))
            print(f"bench_tune: at {at:.0f} s the ETA said the run ends at {predicted:.0f} s "
                  f"({100 * (predicted - took) / took:+.0f}% of the actual {took:.0f} s)")
    return 0


def _seconds(text: str) -> float:
    """progress.human_duration read back: 1h02m, 5m21s, 42s."""
    total = 0
    for number, unit in re.findall(r"(\d+)([hms])", text):
        total += int(number) * {"h": 3600, "m": 60, "s": 1}[unit]
    return total


if __name__ == "__main__":
    sys.exit(main())

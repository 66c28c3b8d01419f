"""Benchmark: host microseconds per decode step that the server trace adds (--speculative-ddtree-trace).

Per step and batch size B, on CPU tensors (D=7 draft positions, a drafter top-K of 8):

  pack columns   StepDraft.of: root, top-8 tokens and log-prob bits into one int32 tensor
                 (on the GPU this is a few small kernels, queued, not waited for)
  records        StepDraft.record up to the writer: the tensor's host copy (a no-op on the
                 CPU: the GPU copy and its sync are NOT measured here), request-id hashes,
                 pack_records
  queue          TraceWriter.write: the records appended to the writer's buffer
  disk write     what the flusher thread's os.write costs per step (page cache, off the
                 step's thread but holding the GIL part of the time)

Not measured: the GPU side (the eager top-8 in place of the one-rank in-graph top-K,
the device -> host copy). Off, the trace costs one `is None` check in the drafter and
one in the verify.

    python3 bench/bench_trace.py                 # markdown table
    python3 bench/bench_trace.py --json out.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from bench_tree import rows_table, time_host, write_json  # noqa: E402
from k26_ddtree.sglang.common import trace  # noqa: E402

DEPTH = 7
BATCHES = (1, 16, 64)
VOCAB = 163_840


def step_inputs(batch: int, seed: int = 0):
    """A step's roots [B], top-8 tokens and descending log-probs [B, D, 8], request ids, steps and
    committed tokens, as the drafter and the verify hand them over."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (batch, DEPTH, trace.TOPK), generator=gen)
    logprobs = torch.log_softmax(torch.randn(batch, DEPTH, 4096, generator=gen), dim=-1).topk(trace.TOPK).values
    roots = torch.randint(0, VOCAB, (batch,), generator=gen)
    rids = [f"{seed:08x}{b:024x}" for b in range(batch)]
    committed = [torch.randint(0, VOCAB, (1 + b % DEPTH,), generator=gen).tolist() for b in range(batch)]
    return roots, tokens, logprobs, rids, list(range(batch)), committed


class _Queue:
    """Stands in for the writer in StepDraft.record, so `records` excludes the queue."""

    active = True

    def write(self, records: bytes) -> None:
        self.last = records


def measure(batch: int, folder: Path, quick: bool) -> dict:
    roots, tokens, logprobs, rids, steps, committed = step_inputs(batch)
    seconds, reps = (0.05, 2000) if quick else (0.5, 100_000)
    row = {"B": batch, "bytes_per_step": batch * trace.record_size(DEPTH)}
    row["pack_us"] = time_host(lambda: trace.StepDraft.of(_Queue(), roots, tokens, logprobs), seconds, reps)
    draft = trace.StepDraft.of(_Queue(), roots, tokens, logprobs)
    row["records_us"] = time_host(lambda: draft.record(rids, steps, committed), seconds, reps)
    records = draft.writer.last

    writer = trace.TraceWriter.open(folder / f"queue-{batch}.trace", {"depth": DEPTH}, 1 << 40)
    row["queue_us"] = time_host(lambda: writer.write(records), seconds, min(reps, 20_000))
    writer.close()

    fd = os.open(folder / f"disk-{batch}.trace", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    row["disk_us"] = time_host(lambda: os.write(fd, records), seconds, min(reps, 20_000))
    os.close(fd)
    row["total_us"] = row["pack_us"] + row["records_us"] + row["queue_us"] + row["disk_us"]
    row["steps_to_1024_mb"] = (1024 << 20) // row["bytes_per_step"]
    return row


COLUMNS = [
    ("B", "B", "{}"),
    ("bytes_per_step", "bytes / step", "{}"),
    ("pack_us", "pack columns µs", "{:.1f}"),
    ("records_us", "records µs", "{:.1f}"),
    ("queue_us", "queue µs", "{:.2f}"),
    ("disk_us", "disk write µs", "{:.1f}"),
    ("total_us", "total µs", "{:.1f}"),
    ("steps_to_1024_mb", "steps to the 1024 MB cap", "{:,}"),
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads for torch (default 1, as the server's "
                        "scheduler has them to spare only for tiny tensors)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="bench-trace-") as folder:
        rows = [measure(batch, Path(folder), args.quick) for batch in BATCHES]
    print(f"\nDDTree server trace, host µs per decode step (whole batch), D={DEPTH}, top-{trace.TOPK}; "
          f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}; GPU cost not measured")
    print(rows_table(rows, COLUMNS))
    if args.json:
        write_json(args.json, {"torch": torch.__version__, "cpu_threads": torch.get_num_threads(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Benchmark: microseconds per decode step to build DDTrees and their retrieve encoding.

Compares the heap reference (Python, one request at a time, CPU) with the
batched builder + compile_ddtree_retrieve on the CPU and, when a GPU is
present, on CUDA: eagerly and replayed from a CUDA graph (the way SGLang runs
it), with the fused Triton builder (what build_ddtree runs on CUDA) and, for
comparison, with the torch-op builder (fused=False). The batched path runs
with validate=False, as in the server. The "aten ops" column counts the aten
operators one torch-op step dispatches (traced on the meta device, so no GPU
is needed): views and bare allocations excluded, each is one or more CUDA
kernels, and under graph replay the per-kernel cost dominates at these sizes.

    python3 bench/bench_tree.py                 # every configuration, markdown table
    python3 bench/bench_tree.py --json out.json # also write the rows as JSON
    python3 bench/bench_tree.py --devices cpu   # skip CUDA

Goal (issue 3): B=64, budget 64, K=8 under graph replay <= 100 us on an H200,
and >= 50x faster than the heap reference.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

from k26_ddtree.bench.report import markdown_table  # noqa: E402
from k26_ddtree.bench.results import write_json_atomic  # noqa: E402
from k26_ddtree.core.reference import heap_ddtree  # noqa: E402
from k26_ddtree.core.retrieve import compile_ddtree_retrieve  # noqa: E402
from k26_ddtree.core.tree import build_ddtree  # noqa: E402

DEPTH = 7
BATCHES = (1, 8, 64)
BUDGETS = (8, 32, 64)
TOPKS = (4, 8)
VOCAB = 163_840


def draft_inputs(batch: int, topk: int, device: str, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, DEPTH, 4096, generator=gen) * 3.0
    top = torch.log_softmax(logits, dim=-1).topk(topk, dim=-1)
    tokens = torch.randint(0, VOCAB, (batch, DEPTH, topk), generator=gen)
    roots = torch.randint(0, VOCAB, (batch,), generator=gen)
    return roots.to(device), tokens.to(device), top.values.to(device)


def step(inputs, budget: int, fused: bool | None = None):
    tree = build_ddtree(*inputs, budget, validate=False, fused=fused)
    return tree, compile_ddtree_retrieve(tree)


class _OpCounter(TorchDispatchMode):
    """Counts the aten ops that launch work: views and bare allocations excluded."""

    ALLOCATIONS = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view and func.overloadpacket.__name__ not in self.ALLOCATIONS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def aten_ops(batch: int, budget: int, topk: int) -> int:
    """aten ops in one torch-op step (meta tensors take the torch ops), after a warm-up
    call that makes the cached constants."""
    inputs = (
        torch.zeros(batch, dtype=torch.long, device="meta"),
        torch.zeros(batch, DEPTH, topk, dtype=torch.long, device="meta"),
        torch.zeros(batch, DEPTH, topk, device="meta"),
    )
    step(inputs, budget)
    with _OpCounter() as counter:
        step(inputs, budget)
    return counter.count


def time_host(fn, min_seconds: float, max_reps: int) -> float:
    """Mean microseconds per call, repeating until min_seconds have passed (at most max_reps)."""
    fn()
    reps, start = 0, time.perf_counter()
    while True:
        fn()
        reps += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds or reps >= max_reps:
            return elapsed / reps * 1e6


def time_cuda(fn, reps: int) -> float:
    """Mean microseconds per call between CUDA events, after a warm-up."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(reps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return begin.elapsed_time(end) / reps * 1e3


def cuda_graph_step(inputs, budget: int, fused: bool):
    """Capture one step in a CUDA graph (warm-up on a side stream first, as
    torch.cuda.graph requires) and return its replay function, after checking
    that the replay equals the CPU's torch-op builder."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step(inputs, budget, fused)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tree, encoding = step(inputs, budget, fused)
    graph.replay()
    torch.cuda.synchronize()
    eager_tree, eager_encoding = step([t.cpu() for t in inputs], budget)
    fields = ("tokens", "parents", "depths", "node_logws")
    got_all = [getattr(tree, f) for f in fields] + list(encoding)
    want_all = [getattr(eager_tree, f) for f in fields] + list(eager_encoding)
    for got, want in zip(got_all, want_all):
        if not torch.equal(got.cpu(), want):
            raise SystemExit("bench_tree: CUDA graph replay disagrees with the CPU builder")
    # The graph writes into the captured outputs' memory: keep them alive with it.
    captured = (graph, tree, encoding)
    return lambda: captured[0].replay()


def measure(batch: int, budget: int, topk: int, devices: list[str], quick: bool) -> dict:
    row = {"B": batch, "budget": budget, "K": topk, "D": DEPTH, "aten_ops": aten_ops(batch, budget, topk)}
    host_inputs = draft_inputs(batch, topk, "cpu")
    row["heap_ref_cpu_us"] = time_host(
        lambda: heap_ddtree(*host_inputs, budget), min_seconds=0.05 if quick else 0.2, max_reps=3 if quick else 20
    )
    if "cpu" in devices:
        row["batched_cpu_us"] = time_host(
            lambda: step(host_inputs, budget), min_seconds=0.05 if quick else 0.2, max_reps=200 if quick else 2000
        )
    if "cuda" in devices:
        cuda_inputs = draft_inputs(batch, topk, "cuda")
        reps = 50 if quick else 500
        row["cuda_eager_us"] = time_cuda(lambda: step(cuda_inputs, budget, True), reps)
        row["cuda_graph_us"] = time_cuda(cuda_graph_step(cuda_inputs, budget, True), reps)
        row["cuda_graph_torch_us"] = time_cuda(cuda_graph_step(cuda_inputs, budget, False), reps)
    fastest = row.get("cuda_graph_us", row.get("batched_cpu_us"))
    row["speedup_vs_heap"] = row["heap_ref_cpu_us"] / fastest
    return row


COLUMNS = [
    ("B", "B", "{}"),
    ("budget", "budget", "{}"),
    ("K", "K", "{}"),
    ("aten_ops", "aten ops", "{}"),
    ("heap_ref_cpu_us", "heap ref CPU µs", "{:.0f}"),
    ("batched_cpu_us", "batched CPU µs", "{:.0f}"),
    ("cuda_eager_us", "CUDA fused eager µs", "{:.1f}"),
    ("cuda_graph_us", "CUDA fused graph µs", "{:.1f}"),
    ("cuda_graph_torch_us", "CUDA torch-op graph µs", "{:.1f}"),
    ("speedup_vs_heap", "heap / fastest", "{:.1f}x"),
]


def rows_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """`columns` are (key, title, format); a column no row has is left out, a cell a row lacks is "-"."""
    present = [c for c in columns if any(c[0] in r for r in rows)]
    return markdown_table([title for _, title, _ in present],
                          [[fmt.format(r[key]) if key in r else "-" for key, _, fmt in present] for r in rows])


def write_json(path: Path, payload: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, payload)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="cpu,cuda", help="comma list of cpu, cuda (cuda skipped without a GPU)")
    parser.add_argument("--json", type=Path, help="also write the results to this JSON file")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--threads", type=int, default=1,
        help="CPU threads for torch (default 1: the tensors are tiny, thread fork-join only adds time)",
    )
    args = parser.parse_args(argv)

    devices = [d.strip() for d in args.devices.split(",") if d.strip()]
    unknown = set(devices) - {"cpu", "cuda"}
    if unknown:
        parser.error(f"unknown device(s): {', '.join(sorted(unknown))}")
    if "cuda" in devices and not torch.cuda.is_available():
        print("bench_tree: no CUDA device, CPU only", file=sys.stderr)
        devices.remove("cuda")
    if not devices:
        parser.error("no device left to measure")

    torch.set_num_threads(args.threads)
    rows = []
    configs = [(b, budget, k) for k in TOPKS for budget in BUDGETS for b in BATCHES]
    for i, (batch, budget, topk) in enumerate(configs, 1):
        print(f"bench_tree: [{i}/{len(configs)}] B={batch} budget={budget} K={topk}", file=sys.stderr, flush=True)
        rows.append(measure(batch, budget, topk, devices, args.quick))

    device_name = torch.cuda.get_device_name() if "cuda" in devices else None
    print(f"\nDDTree build + retrieve encoding, D={DEPTH}, µs per step (whole batch); "
          f"torch {torch.__version__}, CPU threads {torch.get_num_threads()}, "
          f"{platform.processor() or platform.machine()}" + (f", GPU {device_name}" if device_name else ""))
    print(rows_table(rows, COLUMNS))
    if args.json:
        write_json(args.json, {"torch": torch.__version__, "gpu": device_name,
                               "cpu_threads": torch.get_num_threads(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

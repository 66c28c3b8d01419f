"""DDTree step graphs on a real GPU: every replay equals the eager step, bit for bit.

    python tests/gpu/graph_check.py

Needs torch with CUDA and k26_ddtree (no sglang); the seeded inputs come from
tests/core/core_cases.py. For each tree shape (D, K, budget, spine) one
StepGraphs (buckets 1, 2, 4, 8, 16; every other shape captures them all up
front, as the worker does) runs a sequence of decode steps whose batch sizes
interleave and pad (1, 8, 1, 8, 3, 16, 1, 24 > 16, 5, 8, 13), each with fresh
inputs: draft replay then greedy verify replay, both compared with the eager
functions on the same GPU (the fused kernels) and with the CPU's torch ops.
Replays run under torch.cuda.set_sync_debug_mode("error"), so a host sync in
them fails the case. One summary line per case (and the microseconds per step,
eager and replayed, for information); exit code 0 when every case passes, 1
otherwise.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

TESTS = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(TESTS.parent), str(TESTS / "core")]

from core_cases import draft_inputs, walk_target  # noqa: E402

from k26_ddtree.sglang.step_graphs import StepGraphs, StepTree, eager_step, greedy_packed  # noqa: E402

BUCKETS = (1, 2, 4, 8, 16)
MAX_BS = BUCKETS[-1]
BATCHES = (1, 8, 1, 8, 3, 16, 1, 24, 5, 8, 13)
# (D, K, budget, spine): the proving ground's block 8 (D 7) and a block 16 (D 15).
SHAPES = (
    (7, 8, 64, False),
    (7, 8, 64, True),
    (7, 4, 32, False),
    (7, 4, 16, True),
    (7, 1, 7, True),
    (7, 4, 1, False),
    (15, 4, 8, False),
    (15, 8, 8, True),
    (15, 2, 16, False),
    (15, 1, 1, False),
)
VOCAB = 1000


def step_inputs(gen: torch.Generator, batch: int, depth: int, topk: int):
    """(root, top_tokens, top_logprobs, prefix_lens) on the CPU; log-probs rounded to
    multiples of 0.25 so that many prefix scores tie, the cases the tie rule decides."""
    root, tokens, logprobs = draft_inputs(gen, batch, depth, topk, vocab=VOCAB, tie_step=0.25)
    return root, tokens, logprobs, torch.randint(1, 4000, (batch,), generator=gen)


def tree_tensors(step: StepTree) -> list[torch.Tensor]:
    tree = step.tree
    return [tree.tokens, tree.parents, tree.depths, tree.node_logws, step.ancestor, step.positions]


def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(g.shape == w.shape and torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want))


def check_shape(depth: int, topk: int, budget: int, spine: bool, seed: int) -> list[str]:
    """The failures of one shape's step sequence (empty: it passed)."""
    gen = torch.Generator().manual_seed(seed)
    graphs = StepGraphs(BUCKETS)
    up_front = seed % 2 == 0
    if up_front:
        graphs.capture(depth, topk, budget, spine, "cuda")
    failures = []
    for i, batch in enumerate(BATCHES):
        bucket = next((b for b in BUCKETS if b >= batch), None)
        inputs = step_inputs(gen, batch, depth, topk)
        cuda_inputs = [t.cuda() for t in inputs]
        eager = eager_step(*cuda_inputs, budget, spine)
        cpu = eager_step(*inputs, budget, spine)
        nexts = walk_target(gen, eager.tree, vocab=VOCAB).cuda()
        seen = [next((b for b in BUCKETS if b >= earlier), None) for earlier in BATCHES[:i]]
        if up_front or bucket is None or bucket in seen:
            # No capture in this step (capture itself synchronizes): no host sync allowed.
            torch.cuda.set_sync_debug_mode("error")
        try:
            replayed = graphs.draft(*cuda_inputs, budget, spine)
            drafted = tree_tensors(replayed)
            packed = replayed.greedy_packed(nexts)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        from_graph = replayed.graphs is not None
        if from_graph != (batch <= MAX_BS):
            failures.append(f"step {i} B={batch}: from_graph={from_graph}")
        if not same(drafted, tree_tensors(eager)):
            failures.append(f"step {i} B={batch}: draft replay != eager")
        if not same(tree_tensors(cpu), tree_tensors(eager)):
            failures.append(f"step {i} B={batch}: CUDA eager tree != CPU tree")
        if not same([packed], [greedy_packed(eager.tree, nexts)]):
            failures.append(f"step {i} B={batch}: verify replay != eager")
        if not same([packed], [greedy_packed(cpu.tree, nexts.cpu())]):
            failures.append(f"step {i} B={batch}: verify replay != CPU walk")
    distinct = len(BUCKETS) if up_front else len({next(b for b in BUCKETS if b >= x) for x in BATCHES if x <= MAX_BS})
    if graphs.captured != distinct:
        failures.append(f"captured {graphs.captured} shapes, expected {distinct}")
    return failures


def step_us(run, repeats: int = 50) -> float:
    run()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        run()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeats * 1e6


def timing(depth: int, topk: int, budget: int, spine: bool, batch: int = 8) -> tuple[float, float]:
    """(eager µs, replayed µs) per draft + greedy verify step, for information only."""
    gen = torch.Generator().manual_seed(0)
    inputs = [t.cuda() for t in step_inputs(gen, batch, depth, topk)]
    nexts = torch.randint(0, VOCAB, (batch, budget + 1)).cuda()
    graphs = StepGraphs([batch])
    eager = step_us(lambda: greedy_packed(eager_step(*inputs, budget, spine).tree, nexts))
    replayed = step_us(lambda: graphs.draft(*inputs, budget, spine).greedy_packed(nexts))
    return eager, replayed


def main() -> int:
    if not torch.cuda.is_available():
        print("graph_check: no CUDA device")
        return 1
    device = torch.cuda.get_device_name()
    print(f"graph_check on {device}, torch {torch.__version__}, batches {BATCHES}, buckets {BUCKETS}")
    failed = 0
    for seed, (depth, topk, budget, spine) in enumerate(SHAPES):
        name = f"D={depth} K={topk} budget={budget} spine={int(spine)}"
        try:
            failures = check_shape(depth, topk, budget, spine, seed)
        except Exception as error:  # a capture or replay error is this case's failure; go on with the next
            failures = [f"{type(error).__name__}: {error}"]
        eager, replayed = timing(depth, topk, budget, spine) if not failures else (float("nan"), float("nan"))
        verdict = "ok  " if not failures else "FAIL"
        print(f"{verdict} {name}: {len(BATCHES)} steps; B=8 step {eager:.0f} us eager, {replayed:.0f} us replayed")
        for failure in failures:
            print(f"     {failure}")
        failed += bool(failures)
    print(f"graph_check: {len(SHAPES) - failed}/{len(SHAPES)} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

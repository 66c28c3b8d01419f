"""DDTree step graphs on a real GPU: every replay equals the eager step, bit for bit.

    python proving_ground/device/graph_check.py

Needs torch with CUDA and k26_ddtree (no sglang); the seeded inputs come from
tests/core/core_cases.py. For each tree shape (D, K, budget, spine) one
StepGraphs (buckets 1, 2, 4, 8, 16; every other shape captures them all up
front, as the worker does) runs a sequence of decode steps whose batch sizes
interleave and pad (1, 8, 1, 8, 3, 16, 1, 24 > 16, 5, 8, 13), each with fresh
inputs: draft replay then greedy verify replay, both compared with the eager
functions on the same GPU (the fused kernels) and with the CPU's torch ops.
Every other shape starts its draft graph from draft hidden states (the
one-rank draft piece: lm_head and top-K inside the graph; compared with the
eager CUDA step only, since bf16 logits round differently on the CPU), and
every other pair of shapes captures its buckets up front, so all four
combinations run. Last,
the verify's custom-mask and commit kernels (0.5.11's and 0.5.17's commits) against their torch
ops on the GPU.
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

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests" / "core")]

from core_cases import draft_inputs, walk_target  # noqa: E402

from k26_ddtree.core.retrieve import tree_attention_mask  # noqa: E402
from k26_ddtree.core.tree import build_ddtree  # noqa: E402

from k26_ddtree.sglang.common.args import DDTreeConfig  # noqa: E402
from k26_ddtree.sglang.common.draft import DraftHead  # noqa: E402
from k26_ddtree.sglang.common.step_graphs import StepGraphs, StepTree, greedy_acceptance, hidden_step, tree_step  # noqa: E402

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
HIDDEN = 64


def step_inputs(gen: torch.Generator, batch: int, depth: int, topk: int):
    """(root, top_tokens, top_logprobs, prefix_lens) on the CPU; log-probs rounded to
    multiples of 0.25 so that many prefix scores tie, the cases the tie rule decides."""
    root, tokens, logprobs = draft_inputs(gen, batch, depth, topk, vocab=VOCAB, tie_step=0.25)
    return root, tokens, logprobs, torch.randint(1, 4000, (batch,), generator=gen)


def tree_tensors(step: StepTree) -> list[torch.Tensor]:
    tree = step.tree
    return [tree.tokens, tree.parents, tree.depths, tree.node_logws, step.ancestor, step.positions, *step.retrieve[1:]]


def same(got: list[torch.Tensor], want: list[torch.Tensor]) -> bool:
    return all(g.shape == w.shape and torch.equal(g.cpu(), w.cpu()) for g, w in zip(got, want))


def logits_of(target_next: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(target_next, VOCAB).float().view(-1, VOCAB)


def greedy(tree, target_next) -> torch.Tensor:
    return greedy_acceptance(tree, target_next).rows


def check_shape(depth: int, topk: int, budget: int, spine: bool, seed: int) -> list[str]:
    """The failures of one shape's step sequence (empty: it passed)."""
    gen = torch.Generator().manual_seed(seed)
    config = DDTreeConfig(budget=budget, topk=topk, spine=spine, block_size=depth + 1)
    from_hidden = seed % 2 == 1
    head = None
    if from_hidden:
        weight = (torch.randn(VOCAB, HIDDEN, generator=gen) / HIDDEN**0.5).to(torch.bfloat16).cuda()
        head = DraftHead(weight=weight, num_org=VOCAB, org_start=0, num_org_padded=VOCAB, num_added=0,
                         added_start=VOCAB)
    graphs = StepGraphs(config, BUCKETS, head, "cuda")
    # Every pairing of the two: on one rank the worker captures every bucket up front and drafts
    # from hidden states.
    up_front = (seed // 2) % 2 == 0
    if up_front:
        graphs.capture()
    failures = []
    for i, batch in enumerate(BATCHES):
        bucket = next((b for b in BUCKETS if b >= batch), None)
        root, tokens, logprobs, prefix_lens = step_inputs(gen, batch, depth, topk)
        hidden = torch.randn(batch, depth, HIDDEN, generator=gen).to(torch.bfloat16).cuda()
        # On the GPU before the no-sync region: a host -> device copy of pageable memory syncs.
        cuda_inputs = [t.cuda() for t in (root, tokens, logprobs, prefix_lens)]
        if from_hidden:
            # Same GEMM shape as the replay (the bucket), so the bf16 logits round the same way.
            rows = bucket or batch
            pad = lambda t: torch.cat([t, t.new_zeros((rows - batch, *t.shape[1:]))])  # noqa: E731
            eager = hidden_step(config, head, pad(root.cuda()), pad(hidden), pad(prefix_lens.cuda())).first(batch)
            cpu = None
        else:
            eager = tree_step(config, root.cuda(), tokens.cuda(), logprobs.cuda(), prefix_lens.cuda())
            cpu = tree_step(config, root, tokens, logprobs, prefix_lens)
        nexts = walk_target(gen, eager.tree, vocab=VOCAB).cuda()
        logits = logits_of(nexts)
        seen = [next((b for b in BUCKETS if b >= earlier), None) for earlier in BATCHES[:i]]
        if up_front or bucket is None or bucket in seen:
            # No capture in this step (capture itself synchronizes): no host sync allowed.
            torch.cuda.set_sync_debug_mode("error")
        try:
            if from_hidden:
                replayed = graphs.draft_from_hidden(cuda_inputs[0], hidden, cuda_inputs[3])
            else:
                replayed = graphs.draft(*cuda_inputs)
            drafted = tree_tensors(replayed)
            packed = replayed.accept_greedy(logits).rows
        finally:
            torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
        from_graph = replayed.graphs is not None
        if from_graph != (batch <= MAX_BS):
            failures.append(f"step {i} B={batch}: from_graph={from_graph}")
        if not same(drafted, tree_tensors(eager)):
            failures.append(f"step {i} B={batch}: draft replay != eager")
        if cpu is not None and not same(tree_tensors(cpu), tree_tensors(eager)):
            failures.append(f"step {i} B={batch}: CUDA eager tree != CPU tree")
        if not same([packed], [greedy(eager.tree, nexts)]):
            failures.append(f"step {i} B={batch}: verify replay != eager")
        if cpu is not None and not same([packed], [greedy(cpu.tree, nexts.cpu())]):
            failures.append(f"step {i} B={batch}: verify replay != CPU walk")
    distinct = len(BUCKETS) if up_front else len({next(b for b in BUCKETS if b >= x) for x in BATCHES if x <= MAX_BS})
    if graphs.captured != distinct:
        failures.append(f"captured {graphs.captured} buckets, expected {distinct}")
    return failures


def check_verify_kernels() -> list[str]:
    """The fused custom-mask and commit kernels (0.5.11's and 0.5.17's commits) against their
    torch ops, on the GPU."""
    from k26_ddtree.sglang.common.verify_utils import commit_path, verify_custom_mask
    from k26_ddtree.sglang.v0_5_17.ddtree_utils import commit_step

    gen = torch.Generator().manual_seed(11)
    failures = []
    for batch, depth, topk, budget in ((1, 7, 4, 8), (16, 7, 8, 64), (48, 7, 1, 7), (5, 15, 2, 16), (4, 7, 4, 1)):
        root, tokens, logprobs = draft_inputs(gen, batch, depth, topk, vocab=VOCAB)
        tree = build_ddtree(root.cuda(), tokens.cuda(), logprobs.cuda(), budget)
        n = budget + 1
        prefix = torch.randint(0, 3000, (batch,), generator=gen)
        ancestor = tree_attention_mask(tree)
        masks = [verify_custom_mask(ancestor, prefix.cuda(), prefix, fused=f) for f in (True, False)]
        if not torch.equal(*masks):
            failures.append(f"B={batch} budget={budget}: custom mask kernel != torch ops")
        acceptance = greedy_acceptance(tree, walk_target(gen, tree, vocab=VOCAB).cuda())
        lens = (torch.rand(batch, generator=gen) * (acceptance.rows[:, -1].cpu() + 1).float()).long() + 1
        slots = torch.randperm(4 * batch * n, generator=gen)[: batch * n].view(batch, n).cuda()
        pool = torch.randperm(batch + 2, generator=gen)[:batch].cuda()
        out = []
        for fused in (True, False):
            req_to_token = torch.full((batch + 2, 3100 + n), -1, dtype=torch.int32, device="cuda")
            commit = commit_path(acceptance.path, lens.cuda(), slots, req_to_token, pool, prefix.cuda(),
                                 int(lens.sum()), fused=fused)
            out.append([commit.kept_slots, commit.freed_slots, commit.kept_nodes, req_to_token])
        if not same(*out):
            failures.append(f"B={batch} budget={budget}: commit kernel != torch ops")
        out = []
        for fused in (True, False):
            req_to_token = torch.full((batch + 2, 3100 + n), -1, dtype=torch.int32, device="cuda")
            out.append([*commit_step(acceptance.rows, slots, req_to_token, pool, prefix.cuda(), fused=fused),
                        req_to_token])
        if not same(*out) or [t.dtype for t in out[0]] != [t.dtype for t in out[1]]:
            failures.append(f"B={batch} budget={budget}: 0.5.17 commit kernel != torch ops")
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
    root, tokens, logprobs, prefix_lens = [t.cuda() for t in step_inputs(gen, batch, depth, topk)]
    logits = logits_of(torch.randint(0, VOCAB, (batch, budget + 1)).cuda())
    config = DDTreeConfig(budget=budget, topk=topk, spine=spine, block_size=depth + 1)
    graphs = StepGraphs(config, [batch], None, "cuda")
    eager = step_us(lambda: tree_step(config, root, tokens, logprobs, prefix_lens).accept_greedy(logits))
    replayed = step_us(lambda: graphs.draft(root, tokens, logprobs, prefix_lens).accept_greedy(logits))
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
    kernel_failures = check_verify_kernels()
    print(("ok  " if not kernel_failures else "FAIL") + " verify kernels (custom mask, both commits) == torch ops on the GPU")
    for failure in kernel_failures:
        print(f"     {failure}")
    failed += bool(kernel_failures)
    print(f"graph_check: {len(SHAPES) + 1 - failed}/{len(SHAPES) + 1} cases passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

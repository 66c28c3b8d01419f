"""0.5.17's fused commit kernel (k26_ddtree/sglang/v0_5_17/commit_kernel.py) against the torch ops
that define it (ddtree_utils.commit_step, fused=False), run by test_commit_kernel.py in a
subprocess with TRITON_INTERPRET=1. Prints one line per failing case; exit code 1 if any failed."""

from __future__ import annotations

import sys

import torch
from core_cases import draft_inputs, walk_target

from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import PackedAcceptance, verify_greedy
from k26_ddtree.sglang.v0_5_17 import commit_kernel
from k26_ddtree.sglang.v0_5_17.ddtree_utils import StepCommit, commit_step

# (batch, D, K, budget, prefix dtype): one request, odd sizes, a chain, the widest tree, a tree
# narrower than its block, SGLang's int32 lengths.
CASES = [(1, 7, 4, 8, torch.int64), (3, 3, 2, 5, torch.int64), (17, 7, 1, 7, torch.int64),
         (5, 7, 8, 64, torch.int64), (4, 7, 4, 1, torch.int64), (40, 2, 3, 12, torch.int32)]


def one_case(gen: torch.Generator, batch: int, depth: int, topk: int, budget: int, dtype) -> list[str]:
    root, tokens, logprobs = draft_inputs(gen, batch, depth, topk, vocab=30)
    tree = build_ddtree(root, tokens, logprobs, budget)
    n = budget + 1
    packed = PackedAcceptance.pack(tree, verify_greedy(tree, walk_target(gen, tree, vocab=30))).rows
    # A graph's acceptance rows sit in a wider static buffer: strided rows, contiguous columns.
    rows = torch.cat([packed, torch.full((batch, 3), -7)], dim=1)[:, : packed.shape[1]]
    slots = torch.randperm(10 * batch * n, generator=gen)[: batch * n].view(batch, n)
    pool = torch.randperm(batch + 3, generator=gen)[:batch]
    prefix = torch.randint(0, 40, (batch,), generator=gen).to(dtype)
    results = []
    for fused in (True, False):
        req_to_token = torch.full((batch + 3, 48 + n), -1, dtype=torch.int32)
        step = commit_step(rows, slots, req_to_token, pool, prefix, fused=fused)
        results.append((*step, req_to_token))
    names = (*StepCommit._fields, "req_to_token")
    return [name for name, a, b in zip(names, *results) if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b)]


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    failed = 0
    for case in CASES:
        for repeat in range(3):
            for what in one_case(gen, *case):
                print(f"FAIL {case} repeat {repeat}: {what}")
                failed += 1
    commit_kernel.warm_up(9, 7, "cpu")  # the start-up compile runs too
    print(f"{len(CASES) * 3} cases" + (f", {failed} failures" if failed else " agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The verify's fused Triton kernels against the torch ops that define them: verify_kernels.py's
custom mask and 0.5.11 commit (verify_utils.verify_custom_mask, commit_path) and 0.5.17's commit
(v0_5_17/commit_kernel.py, ddtree_utils.commit_step), run by test_ddtree_info.py in a subprocess
with TRITON_INTERPRET=1 and the test process's sys.path (the patched SGLang and its CPU stubs).
Prints one line per failing case; exit code 1 if any failed."""

from __future__ import annotations

import sys

import torch
from core_cases import draft_inputs, walk_target

from k26_ddtree.core.retrieve import tree_attention_mask
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import PackedAcceptance, verify_greedy
from k26_ddtree.sglang.common import verify_kernels
from k26_ddtree.sglang.common.verify_utils import commit_path, verify_custom_mask
from k26_ddtree.sglang.v0_5_17.ddtree_utils import StepCommit, commit_step, warm_up_commit

# (batch, D, K, budget): one request, odd sizes, a chain, the server's widest tree, a tree narrower
# than its depth cap.
CASES = [(1, 7, 4, 8), (3, 3, 2, 5), (17, 7, 1, 7), (5, 7, 8, 64), (40, 2, 3, 12), (4, 7, 4, 1)]


def one_case(gen: torch.Generator, batch: int, depth: int, topk: int, budget: int) -> list[str]:
    root, tokens, logprobs = draft_inputs(gen, batch, depth, topk, vocab=30)
    tree = build_ddtree(root, tokens, logprobs, budget)
    n = budget + 1
    failures = []

    prefix = torch.randint(0, 40, (batch,), generator=gen)
    ancestor = tree_attention_mask(tree)
    got = verify_custom_mask(ancestor, prefix, prefix.clone(), fused=True)
    want = verify_custom_mask(ancestor, prefix, prefix.clone(), fused=False)
    if not torch.equal(got, want):
        failures.append("custom mask")

    acceptance = PackedAcceptance.pack(tree, verify_greedy(tree, walk_target(gen, tree, vocab=30)))
    accepted = acceptance.rows[:, -1]
    # The host may cut a path at a finished request: any length 1 .. accept_len + 1.
    commit_lens = (torch.rand(batch, generator=gen) * (accepted + 1).float()).long() + 1
    node_slots = torch.randperm(10 * batch * n, generator=gen)[: batch * n].view(batch, n)
    pool = torch.randperm(batch + 3, generator=gen)[:batch]
    results = []
    for fused in (True, False):
        req_to_token = torch.full((batch + 3, 64 + n), -1, dtype=torch.int32)
        commit = commit_path(acceptance.path, commit_lens, node_slots, req_to_token, pool, prefix,
                             int(commit_lens.sum()), fused=fused)
        results.append((commit.kept_slots, commit.freed_slots, commit.kept_nodes, req_to_token))
    for name, a, b in zip(("kept slots", "freed slots", "kept nodes", "req_to_token"), *results):
        if a.dtype != b.dtype or not torch.equal(a, b):
            failures.append(name)

    # 0.5.17: the commit of the packed rows as a graph holds them (strided, columns contiguous);
    # lengths int64 as SGLang keeps them, or int32, which the torch ops take as well.
    rows = torch.cat([acceptance.rows, torch.full((batch, 3), -7)], dim=1)[:, : acceptance.rows.shape[1]]
    lengths = prefix.to(torch.int32) if batch % 2 else prefix
    results = []
    for fused in (True, False):
        req_to_token = torch.full((batch + 3, 64 + n), -1, dtype=torch.int32)
        results.append((*commit_step(rows, node_slots, req_to_token, pool, lengths, fused=fused), req_to_token))
    for name, a, b in zip((*StepCommit._fields, "req_to_token"), *results):
        if a.dtype != b.dtype or a.shape != b.shape or not torch.equal(a, b):
            failures.append(f"0.5.17 commit: {name}")
    return failures


def main() -> int:
    gen = torch.Generator().manual_seed(0)
    failed = 0
    for case in CASES:
        for repeat in range(3):
            for what in one_case(gen, *case):
                print(f"FAIL {case} repeat {repeat}: {what}")
                failed += 1
    verify_kernels.warm_up(9, 7, 20, "cpu")  # the start-up compiles run too
    warm_up_commit(9, 7, "cpu", fused=True)
    print(f"{len(CASES) * 3} cases" + (f", {failed} failures" if failed else " agree"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

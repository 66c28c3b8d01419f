"""The fused Triton kernels against the torch ops that define them, run by
test_core_kernels.py in a subprocess with TRITON_INTERPRET=1 (Triton's CPU
interpreter reads that variable when it is imported, so it cannot be set in the
pytest process): the builder (also against the heap reference), the ancestor
mask and the greedy walk. Prints one line per failing case; exit code 1 if any
failed."""

from __future__ import annotations

import sys

import torch
from core_cases import draft_inputs, random_tree, walk_target

from k26_ddtree.core.reference import heap_ddtree
from k26_ddtree.core.retrieve import tree_attention_mask
from k26_ddtree.core.budget import max_budget
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import verify_greedy

FIELDS = ("tokens", "parents", "depths", "node_logws")
# (D, K, budgets): chains, full trees (budget = every prefix), the server's shapes, a block-16 drafter.
CASES = [
    (1, 1, (1,)),
    (2, 3, (1, 5, 12)),
    (7, 1, (1, 3, 7)),
    (3, 4, (2, 16, 84)),
    (7, 4, (8, 33)),
    (7, 8, (8, 64)),
    (15, 2, (24,)),
]
VARIANTS = ((False, 0.0), (True, 0.5), (False, 0.25))  # (spine, tie_step)


def same(got, want) -> bool:
    return all(
        getattr(got, f).dtype == getattr(want, f).dtype and torch.equal(getattr(got, f), getattr(want, f))
        for f in FIELDS
    )


def check_mask_and_walk(gen: torch.Generator) -> tuple[int, int]:
    """(cases, failures) of the mask and walk kernels on builder and hand-made trees."""
    trees = [build_ddtree(*draft_inputs(gen, 3, 7, k, vocab=50, tie_step=0.5), b) for k, b in ((4, 8), (8, 64), (1, 7), (4, 1))]
    trees += [random_tree(gen, 3, n) for n in (1, 2, 9, 30)]
    cases = failures = 0
    for tree in trees:
        cases += 1
        if not torch.equal(tree_attention_mask(tree, fused=True), tree_attention_mask(tree, fused=False)):
            failures += 1
            print(f"MISMATCH ancestor mask, tree {tuple(tree.parents.shape)}")
        for _ in range(3):
            target = walk_target(gen, tree, vocab=50, follow=0.85)
            got, want = verify_greedy(tree, target, fused=True), verify_greedy(tree, target, fused=False)
            cases += 1
            if not all(torch.equal(getattr(got, f), getattr(want, f)) for f in ("accept_len", "path", "next_token")):
                failures += 1
                print(f"MISMATCH greedy walk, tree {tuple(tree.parents.shape)}")
    return cases, failures


def main() -> int:
    gen = torch.Generator().manual_seed(3)
    checked, failures = check_mask_and_walk(gen)
    for depth, topk, budgets in CASES:
        for budget in budgets:
            assert budget <= max_budget(depth, topk)
            # The interpreter runs a program in about a second: the larger shapes get one variant each.
            for spine, tie_step in VARIANTS if budget < 16 else VARIANTS[(budget + depth) % 3 :][:1]:
                args = draft_inputs(gen, 2, depth, topk, tie_step=tie_step)
                # Strided inputs, as SGLang hands them over (the root is a column of the draft block).
                block = torch.stack([args[0], args[0] + 1], dim=1)
                args = (block[:, 0], args[1].transpose(1, 2).contiguous().transpose(1, 2), args[2])
                fused = build_ddtree(*args, budget, spine=spine, fused=True)
                checked += 1
                if not (same(fused, build_ddtree(*args, budget, spine=spine, fused=False))
                        and same(fused, heap_ddtree(*args, budget, spine=spine))):
                    failures += 1
                    print(f"MISMATCH D={depth} K={topk} budget={budget} spine={spine} tie_step={tie_step}")
    print(f"{checked - failures}/{checked} cases agree")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

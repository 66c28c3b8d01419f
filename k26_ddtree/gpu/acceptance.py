"""Exact greedy acceptance of any tree shape along the target's own continuation, offline.

Under greedy decoding the committed text is the target's greedy continuation
whatever the tree, so at each decode step a tree of shape (budget, topk, spine)
commits the longest of its paths that matches that continuation, plus the
bonus. With the drafter's top-K at every possible root position (one batched
drafter forward), the acceptance of every shape follows without a server: a
walk from the prompt's end, each step advancing by its committed length. The
proving ground checks these against what the served configs report.

Also the drafter's rank of the true token at every draft depth: where a tree
can gain over the chain at all (a miss at rank 1 that is a hit at rank 2-4).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k26_ddtree.core.budget import max_budget
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import verify_along

RANK_BUCKETS = ("1", "2", "3", "4", "5-8", ">8")


@dataclass(frozen=True)
class TreeShape:
    budget: int
    topk: int
    spine: bool

    @property
    def name(self) -> str:
        return f"b{self.budget}k{self.topk}" + ("-spine" if self.spine else "")


CHAIN = TreeShape(budget=7, topk=1, spine=False)


@dataclass(frozen=True)
class DraftTopK:
    """The drafter's top-K at every root position of one continuation whose next D + 1
    tokens are known (the first root is the first generated token, the root of the first
    decode step).

    tokens, logprobs  [A, D, K] descending along K
    truth             [A, D + 1] the continuation's tokens after each root
    roots             [A] the root tokens
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    truth: torch.Tensor
    roots: torch.Tensor


def committed_per_root(topk: DraftTopK, shape: TreeShape) -> torch.Tensor:
    """[A] tokens committed (accepted drafts + bonus) by a step rooted at each position; a
    budget above the number of distinct prefixes is the full tree (the chain at D < 7)."""
    depth = topk.tokens.shape[1]
    budget = min(shape.budget, max_budget(depth, shape.topk))
    tree = build_ddtree(topk.roots, topk.tokens[..., : shape.topk], topk.logprobs[..., : shape.topk], budget,
                        spine=shape.spine, fused=False)
    return verify_along(tree, topk.truth).accept_len + 1


def walk_acceptance(committed: list[int]) -> list[int]:
    """The decode steps a server takes from the first root (committed tokens of each step),
    while the step's root has a known continuation."""
    steps, at = [], 0
    while at < len(committed):
        steps.append(committed[at])
        at += committed[at]
    return steps


def acceptance_table(per_sequence: list[DraftTopK], shapes: list[TreeShape]) -> dict[str, float]:
    """Mean committed tokens per step of each shape over the sequences' decode walks."""
    table = {}
    for shape in shapes:
        steps = []
        for topk in per_sequence:
            steps += walk_acceptance(committed_per_root(topk, shape).tolist())
        table[shape.name] = sum(steps) / max(1, len(steps))
    return table


def rank_histogram(ranks: list[torch.Tensor]) -> dict[int, dict[str, int]]:
    """Per draft depth d (1..D), how often the true token sat at each rank bucket, over every
    root position; ranks[i] [A, D] are 1-based ranks of the true token in the drafter's law."""
    all_ranks = torch.cat(ranks, dim=0)
    edges = [(1, 1), (2, 2), (3, 3), (4, 4), (5, 8), (9, 1 << 30)]
    return {
        d + 1: {name: int(((all_ranks[:, d] >= lo) & (all_ranks[:, d] <= hi)).sum()) for name, (lo, hi) in zip(RANK_BUCKETS, edges)}
        for d in range(all_ranks.shape[1])
    }

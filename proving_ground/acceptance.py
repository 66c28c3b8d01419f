"""Exact greedy acceptance of any tree shape along the target's own continuation, offline.

With the drafter's top-K at every possible root position (one batched drafter
forward), core.acceptance.committed_per_root gives what every shape commits at
each, and a walk from the prompt's end, each step advancing by its committed
length, gives the acceptance a server of that shape would see. The proving
ground checks these against what the served configs report (which differ
slightly by definition: a server's completion_tokens / spec_verify_ct also
counts the prefill's token and the last step cut short by max_new_tokens).

Also the drafter's rank of the true token at every draft depth: where a tree
can gain over the chain at all (a miss at rank 1 that is a hit at rank 2-4).
"""

from __future__ import annotations

import torch

from k26_ddtree.core.acceptance import DraftTopK, TreeShape, committed_per_root

RANK_BUCKETS = ("1", "2", "3", "4", "5-8", ">8")


CHAIN = TreeShape(budget=7, topk=1, spine=False)


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


def every_start_table(per_sequence: list[DraftTopK], shapes: list[TreeShape]) -> dict[str, float]:
    """Mean committed tokens of each shape over every root position, not only those a walk lands
    on: beside acceptance_table it shows how much a server's path decides its acceptance."""
    table = {}
    for shape in shapes:
        per_root = torch.cat([committed_per_root(topk, shape).float() for topk in per_sequence])
        table[shape.name] = float(per_root.mean()) if per_root.numel() else 0.0
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

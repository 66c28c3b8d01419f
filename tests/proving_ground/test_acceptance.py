"""Offline exact acceptance of tree shapes along a known continuation (proving_ground.acceptance),
checked against a step-by-step walk written out by hand."""

from __future__ import annotations

import torch

from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import verify_along, verify_greedy
from k26_ddtree.core.acceptance import DraftTopK, TreeShape, committed_per_root
from proving_ground.acceptance import CHAIN, acceptance_table, rank_histogram, walk_acceptance

D, K = 3, 2


def topk_of(rows):
    """A DraftTopK from per-root lists of per-depth ranked candidates, log-probs -r per rank."""
    tokens = torch.tensor([[[t for t in cands] for cands in root] for root, _ in rows])
    truth = torch.tensor([t for _, t in rows])
    logprobs = -torch.arange(K, dtype=torch.float32).expand(tokens.shape).clone() - torch.arange(D).view(1, D, 1)
    return DraftTopK(tokens=tokens, logprobs=logprobs, truth=truth, roots=torch.full((len(rows),), 7))


def test_verify_along_equals_the_greedy_walk_on_the_true_path():
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(10, 14, (6, D, K), generator=gen)
    logprobs = torch.log_softmax(torch.randn(6, D, K, generator=gen), -1).sort(-1, descending=True).values
    tree = build_ddtree(torch.zeros(6, dtype=torch.long), tokens, logprobs, 6)
    truth = torch.randint(10, 14, (6, D + 1), generator=gen)
    # the target's argmax at a node = the truth token after the node's depth, on the true path
    assert torch.equal(verify_along(tree, truth).accept_len, verify_greedy(tree, truth.gather(1, tree.depths)).accept_len)


def test_a_second_rank_hit_is_accepted_by_a_tree_and_not_by_the_chain():
    # depth 1 ranks (20, 21), depth 2 (30, 31), depth 3 (40, 41); the truth goes 21, 30, 40
    topk = topk_of([([[20, 21], [30, 31], [40, 41]], [21, 30, 40, 99])])
    assert committed_per_root(topk, CHAIN).tolist() == [1]
    assert committed_per_root(topk, TreeShape(budget=8, topk=2, spine=True)).tolist() == [3], "21-30-40 costs too much"
    assert committed_per_root(topk, TreeShape(budget=64, topk=2, spine=False)).tolist() == [4], "the full tree"


def test_the_walk_advances_by_each_step_and_averages():
    assert walk_acceptance([3, 9, 9, 2, 9, 9]) == [3, 2, 9]
    topks = [topk_of([([[20, 21], [30, 31], [40, 41]], [20, 30, 40, 5])] * 4)]
    assert acceptance_table(topks, [CHAIN]) == {"b7k1": 4.0}


def test_rank_histogram_buckets_per_depth():
    ranks = torch.tensor([[1, 2, 9], [3, 5, 1]])
    hist = rank_histogram([ranks])
    assert hist[1] == {"1": 1, "2": 0, "3": 1, "4": 0, "5-8": 0, ">8": 0}
    assert hist[2]["2"] == 1 and hist[2]["5-8"] == 1 and hist[3][">8"] == 1

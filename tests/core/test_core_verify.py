"""verify_greedy against a brute-force walk; verify_sampling's committed tokens against
the autoregressive target law (chi-square over >= 50,000 draws, tests/core/sampling_law.py)."""

from __future__ import annotations

import pytest
import torch
from core_cases import draft_inputs, meta_tree, random_tree
from sampling_law import CONTEXT, SHAPES, VOCAB, Case, SyntheticTarget, pvalues

from k26_ddtree.core.reference import children_of, walk_greedy
from k26_ddtree.core.tree import DDTree, build_ddtree
from k26_ddtree.core.verify import Acceptance, committed_tokens, verify_greedy, verify_sampling


def target_next_often_on_tree(tree: DDTree, gen: torch.Generator, vocab: int, hit: float = 0.8) -> torch.Tensor:
    """A target argmax per node that names one of the node's children with probability `hit`."""
    batch, n = tree.tokens.shape
    out = torch.randint(0, vocab, (batch, n), generator=gen)
    for b in range(batch):
        kids = children_of(tree, b)
        for u in range(n):
            if kids[u] and float(torch.rand(1, generator=gen)) < hit:
                pick = kids[u][int(torch.randint(0, len(kids[u]), (1,), generator=gen))]
                out[b, u] = tree.tokens[b, pick]
    return out


def assert_matches_walk(tree: DDTree, acc: Acceptance, target_next: torch.Tensor) -> None:
    depth = tree.depth_cap()
    assert acc.path.shape == (tree.batch_size, depth + 1)
    assert acc.accept_len.dtype == acc.path.dtype == acc.next_token.dtype == torch.long
    for b, (path, bonus) in enumerate(walk_greedy(tree, target_next)):
        assert acc.path[b].tolist() == path + [-1] * (depth + 1 - len(path))
        assert int(acc.accept_len[b]) == len(path) - 1
        assert int(acc.next_token[b]) == bonus


@pytest.mark.parametrize("budget", [1, 2, 8, 16, 64])
@pytest.mark.parametrize("spine", [False, True])
def test_greedy_matches_brute_force_walk(budget, spine):
    gen = torch.Generator().manual_seed(budget + 100 * spine)
    vocab = 40
    tree = build_ddtree(*draft_inputs(gen, 32, 7, 4, vocab=vocab, tie_step=0.5), budget, spine=spine)
    target_next = target_next_often_on_tree(tree, gen, vocab)
    acc = verify_greedy(tree, target_next)
    assert_matches_walk(tree, acc, target_next)
    assert int(acc.accept_len.max()) >= min(2, budget)  # the walks do go deep


def test_greedy_on_hand_made_trees_without_depth_cap():
    gen = torch.Generator().manual_seed(5)
    tree = random_tree(gen, 8, 25)
    target_next = target_next_often_on_tree(tree, gen, 50, hit=0.9)
    assert_matches_walk(tree, verify_greedy(tree, target_next), target_next)


def test_committed_tokens_are_accepted_then_bonus():
    gen = torch.Generator().manual_seed(6)
    tree = build_ddtree(*draft_inputs(gen, 16, 7, 4, vocab=30), 32)
    target_next = target_next_often_on_tree(tree, gen, 30)
    acc = verify_greedy(tree, target_next)
    committed = committed_tokens(tree, acc)
    assert committed.shape == (16, 8)
    for b, (path, bonus) in enumerate(walk_greedy(tree, target_next)):
        want = [int(tree.tokens[b, i]) for i in path[1:]] + [bonus]
        assert committed[b].tolist() == want + [-1] * (8 - len(want))


def test_sampling_with_one_hot_target_is_greedy():
    gen = torch.Generator().manual_seed(7)
    vocab = 40
    tree = build_ddtree(*draft_inputs(gen, 32, 7, 4, vocab=vocab), 48)
    target_next = target_next_often_on_tree(tree, gen, vocab)
    probs = torch.nn.functional.one_hot(target_next, vocab).float()
    sampled = verify_sampling(tree, probs, generator=torch.Generator().manual_seed(1))
    greedy = verify_greedy(tree, target_next)
    for field in ("accept_len", "path", "next_token"):
        assert torch.equal(getattr(sampled, field), getattr(greedy, field))


def test_verify_rejects_mismatched_shapes():
    gen = torch.Generator().manual_seed(8)
    tree = build_ddtree(*draft_inputs(gen, 2, 3, 2), 4)
    with pytest.raises(ValueError, match="target_next must be \\[B, N\\]"):
        verify_greedy(tree, torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="target_next must be torch.long"):
        verify_greedy(tree, torch.zeros(2, 5, dtype=torch.int32))
    with pytest.raises(ValueError, match="target_probs must be \\[B, N, V\\]"):
        verify_sampling(tree, torch.ones(2, 5))
    with pytest.raises(ValueError, match="target_probs must be a floating-point"):
        verify_sampling(tree, torch.ones(2, 5, 3, dtype=torch.long))


def test_verify_has_no_host_sync_when_the_tree_knows_its_depth():
    tree = meta_tree()
    assert verify_greedy(tree, torch.zeros(4, 33, dtype=torch.long, device="meta")).path.shape == (4, 8)
    committed = committed_tokens(tree, verify_sampling(tree, torch.ones(4, 33, 10, device="meta")))
    assert committed.shape == (4, 8)


# --- sampling exactness --------------------------------------------------------------

DRAWS = 60_000


def torch_verify(target: SyntheticTarget, seed: int, node_probs=None):
    """The torch sampling verify as a sampling_law Commit, seeded."""
    gen = torch.Generator().manual_seed(seed)
    node_probs = node_probs or target.node_probs

    def commit(tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        return committed_tokens(tree, verify_sampling(tree, node_probs(tree, before_root), generator=gen))

    return commit


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("depth,topk,budget,spine,top_p,top_k", SHAPES[:6])
def test_sampling_commits_the_autoregressive_law(depth, topk, budget, spine, top_p, top_k, temperature):
    target = SyntheticTarget(Case(depth, topk, budget, spine, temperature, top_p, top_k))
    p_first, p_pair, accepted = pvalues(target, DRAWS, torch_verify(target, seed=int(temperature * 10) + budget))
    assert p_first > 1e-3 and p_pair > 1e-3
    # The trees do their job: draft tokens get accepted, down to the depth cap when it can be reached.
    assert accepted.float().mean() > 0.3
    if budget >= depth:
        assert int(accepted.max()) == depth


def test_top_k_keeps_the_k_likeliest_tokens_then_top_p_cuts_what_is_left():
    target = SyntheticTarget(Case(3, 3, 16, False, 1.0, top_p=0.5, top_k=3))
    whole = SyntheticTarget(Case(3, 3, 16, False, 1.0))
    ctx = (torch.tensor(CONTEXT[0]), torch.tensor(CONTEXT[1]))
    law, full = target.law(*ctx), whole.law(*ctx)
    kept = full.topk(3).indices
    mass = full[kept] / full[kept].sum()
    keep = (mass.cumsum(0) - mass) < 0.5
    want = torch.zeros(VOCAB)
    want[kept[keep]] = mass[keep] / mass[keep].sum()
    assert torch.allclose(law, want)


def test_chi_square_catches_probs_given_to_the_wrong_nodes():
    """A classic integration bug: every node checked against the root's law.
    The first token stays right; the second must be rejected."""
    target = SyntheticTarget(Case(3, 3, 16, False, 1.0))

    def root_law_everywhere(tree, before_root):
        right = target.node_probs(tree, before_root)
        return right[:, :1].expand_as(right)

    p_first, p_pair, _ = pvalues(target, DRAWS, torch_verify(target, seed=4, node_probs=root_law_everywhere))
    assert p_first > 1e-3
    assert p_pair < 1e-9

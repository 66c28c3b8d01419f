"""verify_greedy against a brute-force walk; verify_sampling's committed tokens against
the autoregressive target law (chi-square over >= 50,000 draws)."""

from __future__ import annotations

import pytest
import torch
from core_cases import draft_inputs, meta_tree, random_tree

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

VOCAB = 6
DRAWS = 60_000
CONTEXT = (2, 4)  # the two tokens before the first draft: (token before the root, root)


class SyntheticTarget:
    """A target whose next-token law depends on the last two tokens, and a drafter
    whose top-K follows the target's greedy chain from the root (so walks go deep)
    and depends on the root token, so every node has its own law."""

    def __init__(self, seed: int, depth: int, topk: int, temperature: float, top_p: float | None):
        gen = torch.Generator().manual_seed(seed)
        self.logits = torch.randn(VOCAB, VOCAB, VOCAB, generator=gen) * 1.2
        self.temperature = temperature
        self.top_p = top_p
        prev2, prev = torch.full((VOCAB,), CONTEXT[0]), torch.arange(VOCAB)
        tokens, logprobs = [], []
        for _ in range(depth):
            top = torch.log_softmax(self.logits[prev2, prev], dim=-1).topk(topk, dim=-1)
            tokens.append(top.indices)
            logprobs.append(top.values)
            prev2, prev = prev, top.indices[:, 0]
        self.draft_tokens = torch.stack(tokens, dim=1)  # [root token, D, K]
        self.draft_logprobs = torch.stack(logprobs, dim=1)

    def law(self, prev2: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(self.logits[prev2, prev] / self.temperature, dim=-1)
        if self.top_p is not None:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            drop = sorted_probs.cumsum(-1) - sorted_probs >= self.top_p
            sorted_probs = sorted_probs.masked_fill(drop, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def tree(self, roots: torch.Tensor, budget: int, spine: bool) -> DDTree:
        return build_ddtree(roots, self.draft_tokens[roots], self.draft_logprobs[roots], budget, spine=spine)

    def node_probs(self, tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        parent_token = tree.tokens.gather(1, tree.parents.clamp(min=0))
        prev2 = torch.where(tree.parents >= 0, parent_token, before_root.unsqueeze(1))
        return self.law(prev2, tree.tokens)


def first_two_committed(target: SyntheticTarget, budget: int, spine: bool, seed: int, node_probs=None):
    """Run one verify step on DRAWS copies of the same context; where it commits
    a single token, run the next step (its tree rooted at that token) for the second."""
    before, root = (torch.full((DRAWS,), t, dtype=torch.long) for t in CONTEXT)
    node_probs = node_probs or target.node_probs
    gen = torch.Generator().manual_seed(seed)
    tree = target.tree(root, budget, spine)
    acc = verify_sampling(tree, node_probs(tree, before), generator=gen)
    first = committed_tokens(tree, acc)
    t1 = first[:, 0]
    next_tree = target.tree(t1, budget, spine)
    second = committed_tokens(next_tree, verify_sampling(next_tree, node_probs(next_tree, root), generator=gen))
    t2 = torch.where(first[:, 1] >= 0, first[:, 1], second[:, 0])
    return t1, t2, acc.accept_len


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells expected below 5 are pooled into one.
    Cells of probability 0 must never be observed (that alone disproves exactness)."""
    counts, probs = counts.double().flatten(), probs.double().flatten()
    assert counts[probs == 0].sum() == 0, "a token of probability 0 was committed"
    keep = probs > 0
    counts, expected = counts[keep], probs[keep] * counts.sum()
    small = expected < 5
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum(0, keepdim=True)])
        expected = torch.cat([expected[~small], expected[small].sum(0, keepdim=True)])
    if len(counts) < 2:
        return 1.0  # a single possible outcome: nothing left to test
    stat = ((counts - expected) ** 2 / expected).sum()
    dof = torch.tensor(float(len(counts) - 1), dtype=torch.float64)
    return float(torch.special.gammaincc(dof / 2, stat / 2))


def autoregressive_laws(target: SyntheticTarget):
    before, root = CONTEXT
    p1 = target.law(torch.tensor(before), torch.tensor(root))
    p2 = target.law(torch.full((VOCAB,), root), torch.arange(VOCAB))  # p2[t1] = law after (root, t1)
    return p1, p1[:, None] * p2


CASES = [
    # (depth, topk, budget, spine, top_p): chains, siblings, leaves at the depth cap
    (3, 2, 1, False, None),
    (3, 3, 2, False, None),
    (3, 3, 16, False, None),
    (3, 4, 64, False, None),
    (5, 2, 5, True, None),
    (4, 3, 64, False, 0.8),
]


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("depth,topk,budget,spine,top_p", CASES)
def test_sampling_commits_the_autoregressive_law(depth, topk, budget, spine, top_p, temperature):
    target = SyntheticTarget(seed=budget * 7 + topk, depth=depth, topk=topk, temperature=temperature, top_p=top_p)
    t1, t2, accepted = first_two_committed(target, budget, spine, seed=int(temperature * 10) + budget)
    p1, joint = autoregressive_laws(target)

    assert chi_square_pvalue(torch.bincount(t1, minlength=VOCAB), p1) > 1e-3
    pairs = torch.bincount(t1 * VOCAB + t2, minlength=VOCAB * VOCAB)
    assert chi_square_pvalue(pairs, joint) > 1e-3
    # The trees do their job: draft tokens get accepted, down to the depth cap when it can be reached.
    assert accepted.float().mean() > 0.3
    if budget >= depth:
        assert int(accepted.max()) == depth


def test_chi_square_catches_probs_given_to_the_wrong_nodes():
    """A classic integration bug: every node checked against the root's law.
    The first token stays right; the second must be rejected."""
    target = SyntheticTarget(seed=3, depth=3, topk=3, temperature=1.0, top_p=None)

    def root_law_everywhere(tree, before_root):
        right = target.node_probs(tree, before_root)
        return right[:, :1].expand_as(right)

    t1, t2, _ = first_two_committed(target, 16, False, seed=4, node_probs=root_law_everywhere)
    p1, joint = autoregressive_laws(target)
    assert chi_square_pvalue(torch.bincount(t1, minlength=VOCAB), p1) > 1e-3
    assert chi_square_pvalue(torch.bincount(t1 * VOCAB + t2, minlength=VOCAB * VOCAB), joint) < 1e-9

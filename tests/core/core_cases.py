"""Seeded random inputs for the DDTree tests (core, SGLang wiring, the GPU graph check)."""

from __future__ import annotations

import torch

from k26_ddtree.core.tree import DDTree, build_ddtree


def draft_inputs(gen: torch.Generator, batch: int, depth: int, topk: int, *, vocab: int = 1000, tie_step: float = 0.0):
    """(root_tokens, top_tokens, top_logprobs) like a drafter's top-K.

    Tokens in one draft position are distinct (a top-K never repeats a token).
    tie_step > 0 rounds log-probs to multiples of it, which makes many exact
    ties between prefix scores (and zeros), the cases the tie rule decides.
    """
    vocab = max(vocab, topk)
    logits = torch.randn(batch, depth, vocab, generator=gen) * 2.0
    top = torch.log_softmax(logits, dim=-1).topk(topk, dim=-1)
    logprobs = top.values
    if tie_step:
        logprobs = (logprobs / tie_step).round() * tie_step
        logprobs = logprobs.sort(dim=-1, descending=True).values.clamp(max=0.0)
    tokens = torch.argsort(torch.rand(batch, depth, vocab, generator=gen), dim=-1)[..., :topk]
    roots = torch.randint(0, vocab, (batch,), generator=gen)
    return roots, tokens, logprobs


def walk_target(gen: torch.Generator, tree: DDTree, *, vocab: int, follow: float = 0.8) -> torch.Tensor:
    """[B, N] target argmax for a greedy walk: at a node with children, with probability
    `follow` the token of one of them (so walks go deep), else a random token."""
    parents, tokens = tree.parents.cpu(), tree.tokens.cpu()
    batch, n = parents.shape
    is_child = parents.unsqueeze(1) == torch.arange(n).view(1, n, 1)
    child = ((torch.rand(batch, n, n, generator=gen) + 1.0) * is_child).argmax(dim=2)
    follows = is_child.any(dim=2) & (torch.rand(batch, n, generator=gen) < follow)
    return torch.where(follows, tokens.gather(1, child), torch.randint(0, vocab, (batch, n), generator=gen))


def random_tree(gen: torch.Generator, batch: int, n: int, *, vocab: int = 50) -> DDTree:
    """A hand-made batch of trees (not from the builder): random parents with
    parents[i] < i, random scores (siblings not in index order), no max_depth."""
    parents = torch.full((batch, n), -1, dtype=torch.long)
    depths = torch.zeros(batch, n, dtype=torch.long)
    for i in range(1, n):
        parents[:, i] = torch.randint(0, i, (batch,), generator=gen)
        depths[:, i] = depths.gather(1, parents[:, i : i + 1]).squeeze(1) + 1
    logws = -torch.rand(batch, n, generator=gen) * 5.0
    logws[:, 0] = 0.0
    # Sibling tokens distinct: a node's token is drawn without repetition per parent.
    tokens = torch.empty(batch, n, dtype=torch.long)
    for b in range(batch):
        perm = torch.randperm(vocab, generator=gen)
        tokens[b] = perm[:n] if n <= vocab else torch.arange(n)
    return DDTree(tokens=tokens, parents=parents, depths=depths, node_logws=logws)


def meta_tree(batch: int = 4, depth: int = 7, topk: int = 8, budget: int = 32) -> DDTree:
    """A builder tree on the meta device: any op that needs the data (a host sync) fails there."""
    meta = dict(device="meta")
    return build_ddtree(
        torch.zeros(batch, dtype=torch.long, **meta),
        torch.zeros(batch, depth, topk, dtype=torch.long, **meta),
        torch.zeros(batch, depth, topk, **meta),
        budget,
        validate=False,
    )

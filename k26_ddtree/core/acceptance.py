"""What a tree shape commits when the text it is verified against is already known.

Under greedy decoding the committed text is the target's greedy continuation whatever the
tree, so a step rooted at a position commits the longest path of its tree that matches that
continuation, plus the bonus. With the drafter's top-K at a set of roots, every tree shape's
acceptance there follows without running the target. `k26-deploy tune`'s replay of a
server trace stands on it, and so does any offline table of a known continuation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k26_ddtree.core.budget import max_budget
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.tree import child_keys
from k26_ddtree.core.verify import verify_along

# Roots per tree build: bounds the [roots, nodes, nodes] parent match to ~20 MB at budget 64.
CHUNK_ROOTS = 4096


@dataclass(frozen=True)
class TreeShape:
    budget: int
    topk: int
    spine: bool

    @property
    def name(self) -> str:
        return f"b{self.budget}k{self.topk}" + ("-spine" if self.spine else "")


@dataclass(frozen=True)
class DraftTopK:
    """The drafter's top-K at A roots and the known text after each.

    tokens, logprobs  [A, D, K] descending along K (finite, <= 0: the caller checks)
    truth             [A, D + 1] the continuation's tokens after each root, -1 where unknown
    roots             [A] the root tokens
    """

    tokens: torch.Tensor
    logprobs: torch.Tensor
    truth: torch.Tensor
    roots: torch.Tensor


def committed_per_root(draft: DraftTopK, shape: TreeShape) -> torch.Tensor:
    """[A] tokens committed (accepted drafts + bonus) by a step rooted at each root; a budget
    above the number of distinct prefixes is the full tree (the chain at D < 7). Near the end of
    the known text a step commits at most the tokens left: the request ended there (its length
    limit or EOS), and a server cuts the step's commit at the finish too."""
    depth = draft.tokens.shape[1]
    budget = min(shape.budget, max_budget(depth, shape.topk))
    out = []
    for lo in range(0, draft.roots.shape[0], CHUNK_ROOTS):
        part = slice(lo, lo + CHUNK_ROOTS)
        tree = build_ddtree(draft.roots[part], draft.tokens[part, :, :shape.topk], draft.logprobs[part, :, :shape.topk],
                            budget, spine=shape.spine, validate=False, fused=False)
        left = (draft.truth[part] >= 0).sum(dim=1)
        out.append(torch.minimum(verify_along(tree, draft.truth[part]).accept_len + 1, left))
    return torch.cat(out) if out else torch.zeros(0, dtype=torch.long)


def committed_every_budget(draft: DraftTopK, topk: int, budget: int) -> torch.Tensor:
    """[2, A, budget] tokens committed by a step rooted at each root under the trees of this topk at
    every budget 1..budget, spine off (row 0) and on (row 1): committed_per_root of each such shape,
    from one pass instead of 2 * budget tree builds. `budget` must not exceed max_budget(D, topk).

    The tree at budget b is the b + 1 smallest keys of every prefix (tree.py), so the first b + 1
    nodes of the tree at the largest budget: a step accepts through the depth-d node of the true
    path at budget b exactly when fewer than b + 1 prefixes have a smaller key, counting the root.
    So the counts for the true path's nodes give every budget's acceptance at once, and only the
    candidates of the largest tree are needed to take them (the builder's per-depth survivors,
    unsorted), never the tree itself. The spine puts the root and the rank-0 chain first."""
    depth = draft.tokens.shape[1]
    levels = min(depth, budget)
    base = max(topk, 2)
    plan = tree_plan(depth, topk, budget)
    out = torch.empty(2, draft.roots.shape[0], budget, dtype=torch.long)
    budgets = torch.arange(1, budget + 1)
    for lo in range(0, draft.roots.shape[0], CHUNK_ROOTS):
        part = slice(lo, lo + CHUNK_ROOTS)
        logprobs = draft.logprobs[part, :levels, :topk].float().transpose(0, 1).contiguous().transpose(0, 1)
        truth = draft.truth[part]
        rows = logprobs.shape[0]
        # The true path: the rank of the committed token among the draft's top-k at each depth.
        match = (draft.tokens[part, :levels, :topk] == truth[:, :levels, None]) & (truth[:, :levels, None] >= 0)
        found = match.any(-1)
        rank = match.int().argmax(-1)
        on_path = found.cumprod(1).bool()
        # Keys as the builder makes them: float32 cost bits above the path code, costs summed in
        # the same order; the spine's keys are those of rank 0 at every depth.
        path_cost = torch.zeros(rows)
        spine_cost = torch.zeros(rows)
        code = torch.ones(rows, dtype=torch.long)
        path_keys, spine_keys = [], []
        for d in range(levels):
            path_cost = path_cost - logprobs[:, d].gather(1, rank[:, d:d + 1]).squeeze(1)
            spine_cost = spine_cost - logprobs[:, d, 0]
            code = code * base + rank[:, d]
            path_keys.append((path_cost.view(torch.int32).long() << 32) + code)
            spine_keys.append((spine_cost.view(torch.int32).long() << 32) + base ** (d + 1))
        path_key = torch.stack(path_keys, 1)
        spine_key = torch.stack(spine_keys, 1)
        # Only steps whose true path enters the tree need the count; the others accept no draft.
        entering = on_path[:, 0].nonzero().squeeze(1)
        smaller = torch.full((rows, levels), budget + 1, dtype=torch.long)
        keys = _candidates(logprobs[entering], plan, base).sort(1).values
        smaller[entering] = torch.searchsorted(keys, path_key[entering])
        spine_path = (rank == 0).cumprod(1).bool()
        spine_smaller = torch.searchsorted(spine_key, path_key)
        position = {False: smaller,
                    True: torch.where(spine_path, torch.arange(1, levels + 1), levels + smaller - spine_smaller)}
        left = (truth >= 0).sum(dim=1, keepdim=True)
        wanted = budgets.expand(rows, budget).contiguous()
        for row, spine in enumerate((False, True)):
            # Positions grow along the true path, so the nodes a budget holds are a prefix of it.
            reached = torch.where(on_path, position[spine], budget + 1).contiguous()
            accepted = torch.searchsorted(reached, wanted, right=True)
            out[row, part] = torch.minimum(accepted + 1, left)
    return out


def tree_plan(depth: int, topk: int, budget: int) -> tuple[int, ...]:
    """Per depth 1..min(depth, budget), how many of the best prefixes of that depth can be in the
    tree of `budget` nodes (tree.py's survivors)."""
    kept, survivors = [], 1
    for d in range(1, min(depth, budget) + 1):
        survivors = min(survivors * topk, budget - d + 1)
        kept.append(survivors)
    return tuple(kept)


def _candidates(logprobs: torch.Tensor, kept: tuple[int, ...], base: int) -> torch.Tensor:
    """[A, 1 + sum(kept)] keys of the root and every depth's survivors, in no particular order;
    logprobs [A, levels, topk] float32."""
    rows, _, topk = logprobs.shape
    ranks = torch.arange(topk, dtype=torch.int32)
    survivors = torch.ones(rows, 1, dtype=torch.long)
    found = [survivors]
    for d, count in enumerate(kept):
        children = child_keys(survivors, logprobs[:, d], ranks, base)
        # The keys are unique, so the same survivors come out whatever order topk leaves them in.
        survivors = children if children.shape[1] == count else children.topk(count, 1, largest=False, sorted=False).values
        found.append(survivors)
    return torch.cat(found, 1)

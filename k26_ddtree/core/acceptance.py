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

"""Exact tree sampling, judged: a synthetic target whose autoregressive law is known, two
committed tokens drawn through a verify step many times, and a chi-square test of them against
that law. The CPU tests run it through the torch verify; proving_ground/device/sampling_check.py
through SGLang's DDTree verify input and sgl_kernel's tree kernel on a GPU."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable, NamedTuple

import torch

from k26_ddtree.core.tree import DDTree, build_ddtree

VOCAB = 6
CONTEXT = (2, 4)  # the two tokens before the first draft: (token before the root, root)
# (depth, top-K, budget, spine, top_p, top_k): chains, siblings, leaves at the depth cap, the
# block of 8 the proving ground serves, wide trees, and the served law (top-p 0.95).
SHAPES = (
    (3, 2, 1, False, None, None),
    (3, 3, 2, False, None, None),
    (3, 3, 16, False, None, None),
    (3, 4, 64, False, None, None),
    (5, 2, 5, True, None, None),
    (4, 3, 64, False, 0.8, None),
    (7, 1, 7, True, None, None),
    (7, 4, 8, False, None, None),
    (7, 4, 8, True, None, None),
    (7, 4, 16, True, 0.95, None),
    (7, 5, 32, False, None, None),
    (7, 6, 64, True, None, None),
    (4, 3, 32, False, None, 3),
    (4, 3, 32, True, 0.9, 4),
    (7, 4, 16, False, 0.95, None),
)


class Case(NamedTuple):
    """One sampling law and tree shape; top_k None and top_p None leave the law whole."""

    depth: int
    topk: int
    budget: int
    spine: bool
    temperature: float
    top_p: float | None = None
    top_k: int | None = None

    @property
    def seed(self) -> int:
        return self.budget * 7 + self.topk

    def __str__(self) -> str:
        law = f"T {self.temperature}" + (f" top-k {self.top_k}" if self.top_k else "") + (
            f" top-p {self.top_p}" if self.top_p else "")
        return f"D {self.depth} K {self.topk} budget {self.budget}{' spine' if self.spine else ''}, {law}"


class SyntheticTarget:
    """A target whose next-token law depends on the last two tokens, and a drafter
    whose top-K follows the target's greedy chain from the root (so walks go deep)
    and depends on the root token, so every node has its own law."""

    def __init__(self, case: Case, device: str | torch.device = "cpu"):
        gen = torch.Generator().manual_seed(case.seed)
        self.case = case
        self.logits = torch.randn(VOCAB, VOCAB, VOCAB, generator=gen) * 1.2
        prev2, prev = torch.full((VOCAB,), CONTEXT[0]), torch.arange(VOCAB)
        tokens, logprobs = [], []
        for _ in range(case.depth):
            top = torch.log_softmax(self.logits[prev2, prev], dim=-1).topk(case.topk, dim=-1)
            tokens.append(top.indices)
            logprobs.append(top.values)
            prev2, prev = prev, top.indices[:, 0]
        self.draft_tokens = torch.stack(tokens, dim=1).to(device)  # [root token, D, K]
        self.draft_logprobs = torch.stack(logprobs, dim=1).to(device)
        self.logits = self.logits.to(device)

    def law(self, prev2: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        """[..., V] the next-token law: temperature, then top-k, then top-p, as SGLang samples."""
        case = self.case
        probs = torch.softmax(self.logits[prev2, prev] / case.temperature, dim=-1)
        for cut, keep in ((case.top_k, lambda rank, before: rank < case.top_k),
                          (case.top_p, lambda rank, before: before < case.top_p)):
            if cut is None:
                continue
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            rank = torch.arange(VOCAB, device=probs.device).expand_as(sorted_probs)
            sorted_probs = torch.where(keep(rank, sorted_probs.cumsum(-1) - sorted_probs), sorted_probs, 0.0)
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
            probs = probs / probs.sum(-1, keepdim=True)
        return probs

    def tree(self, roots: torch.Tensor, budget: int, spine: bool) -> DDTree:
        return build_ddtree(roots, self.draft_tokens[roots], self.draft_logprobs[roots], budget, spine=spine)

    def node_context(self, tree: DDTree, before_root: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(prev2, prev) [B, N] at every node: its parent's token (the token before the root at
        the root) and its own."""
        parent_token = tree.tokens.gather(1, tree.parents.clamp(min=0))
        return torch.where(tree.parents >= 0, parent_token, before_root.unsqueeze(1)), tree.tokens

    def node_probs(self, tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        """[B, N, V] the law after every node."""
        return self.law(*self.node_context(tree, before_root))

    def node_logits(self, tree: DDTree, before_root: torch.Tensor) -> torch.Tensor:
        """[B * N, V] the raw logits after every node, as a target forward returns them."""
        prev2, prev = self.node_context(tree, before_root)
        return self.logits[prev2, prev].reshape(-1, VOCAB)


class SamplingInfo(SimpleNamespace):
    """SGLang's SamplingBatchInfo fields a DDTree verify reads, for requests of one law."""

    def __len__(self) -> int:
        return self.temperatures.shape[0]


def sampling_info(batch: int, temperature: float, top_k: int | None = None, top_p: float | None = None,
                  device: str | torch.device = "cpu") -> SamplingInfo:
    """`batch` requests sampling at `temperature`, cut to top_k and top_p where given."""
    return SamplingInfo(
        is_all_greedy=False,
        temperatures=torch.full((batch, 1), temperature, device=device),
        top_ks=torch.full((batch,), top_k or VOCAB, dtype=torch.int32, device=device),
        top_ps=torch.full((batch,), top_p or 1.0, device=device),
        need_top_k_sampling=top_k is not None,
        need_top_p_sampling=top_p is not None,
        has_custom_logit_processor=False,
        penalizer_orchestrator=SimpleNamespace(is_required=False),
        logit_bias=None,
    )


# commit(tree, before_root) -> [B, D + 1] the committed tokens of one verify step (-1 past them)
Commit = Callable[[DDTree, torch.Tensor], torch.Tensor]


def first_two_committed(target: SyntheticTarget, draws: int, commit: Commit):
    """(t1, t2, accepted) [draws] each: one verify step on `draws` copies of the same context;
    where it commits a single token, the next step (its tree rooted at that token) gives the
    second. accepted: the first step's accepted drafts."""
    case = target.case
    device = target.logits.device
    before, root = (torch.full((draws,), t, dtype=torch.long, device=device) for t in CONTEXT)
    first = commit(target.tree(root, case.budget, case.spine), before)
    t1 = first[:, 0]
    second = commit(target.tree(t1, case.budget, case.spine), root)
    t2 = torch.where(first[:, 1] >= 0, first[:, 1], second[:, 0])
    return t1, t2, (first >= 0).sum(dim=1) - 1


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells expected below 5 are pooled into one.
    A committed token of probability 0 alone disproves exactness: p is then 0."""
    counts, probs = counts.double().flatten().cpu(), probs.double().flatten().cpu()
    if counts[probs == 0].sum() > 0:
        return 0.0
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


def autoregressive_laws(target: SyntheticTarget) -> tuple[torch.Tensor, torch.Tensor]:
    """(p1 [V], joint [V, V]): the first token's law and the first two tokens' joint law."""
    device = target.logits.device
    before, root = CONTEXT
    p1 = target.law(torch.tensor(before, device=device), torch.tensor(root, device=device))
    p2 = target.law(torch.full((VOCAB,), root, device=device), torch.arange(VOCAB, device=device))
    return p1, p1[:, None] * p2  # p2[t1]: the law after (root, t1)


def pvalues(target: SyntheticTarget, draws: int, commit: Commit,
            law: SyntheticTarget | None = None) -> tuple[float, float, torch.Tensor]:
    """(p of the first token, p of the first two, accepted drafts [draws]): `target`'s trees
    committed, judged by `law`'s autoregressive law (by default target's own)."""
    t1, t2, accepted = first_two_committed(target, draws, commit)
    p1, joint = autoregressive_laws(law or target)
    return (chi_square_pvalue(torch.bincount(t1, minlength=VOCAB), p1),
            chi_square_pvalue(torch.bincount(t1 * VOCAB + t2, minlength=VOCAB * VOCAB), joint), accepted)

"""Greedy acceptance of every tree shape from a server trace, exactly, per traced step.

Under greedy decoding the text a request commits does not depend on the tree, and a
DFlash draft at a root depends only on the committed prefix, not on the served shape.
So a traced step, rooted where it was, would have committed under any other shape the
longest path of that shape's tree (built from the same top-8 draft) that matches the
tokens the request actually committed from that root on, plus the bonus: the known
continuation is the step's own committed tokens followed by those of the request's
next steps. The steps are the roots the served shape visited; another shape would have
visited others of the same text, so the mean over the traced steps is the estimate.

SGLang's accept_length (and bench's) is completion tokens per verify step, and a request's
first token comes from its prefill, not from a step; `as_served` scales the per-step means
by that, from the trace's whole requests, so tune's figures read like the server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from k26_ddtree.core.acceptance import DraftTopK, TreeShape, committed_per_root
from k26_ddtree.core.budget import codes_fit, max_budget
from k26_ddtree.errors import UserError
from k26_ddtree.sglang.trace import TOPK, Steps

BUDGETS = range(1, 65)
TOPKS = range(1, TOPK + 1)


@dataclass(frozen=True)
class Replay:
    """The traced steps with the continuation each one had.

    roots [S], tokens / logprobs [S, D, TOPK], truth [S, D + 1] (-1 past the request's known text)
    short: steps whose known text ends before D + 1 tokens; requests: distinct requests
    served_scale: completion tokens over decode-step tokens of the requests traced from their
    first step on without a gap (1 when there is none)
    """

    roots: torch.Tensor
    tokens: torch.Tensor
    logprobs: torch.Tensor
    truth: torch.Tensor
    short: int
    requests: int
    served_scale: float

    @property
    def depth(self) -> int:
        return self.tokens.shape[1]

    @property
    def steps(self) -> int:
        return self.tokens.shape[0]


def chain(depth: int) -> TreeShape:
    """The linear DFlash chain as a tree: every draft position, rank 1 only."""
    return TreeShape(budget=depth, topk=1, spine=False)


def all_shapes(depth: int) -> list[TreeShape]:
    """Every (budget 1..64, topk 1..8, spine off/on) the builder accepts at draft depth `depth`."""
    return [TreeShape(budget, topk, spine) for spine in (False, True) for topk in TOPKS for budget in BUDGETS
            if budget <= max_budget(depth, topk) and codes_fit(depth, topk, budget)]


def searched_shapes(depth: int, spines: tuple[bool, ...], budgets: range) -> list[TreeShape]:
    """The shapes a tune replays: those of `spines` with a budget in `budgets`, and the chains the
    table and plot stand beside them (b{depth}k1, plain and as a tree of each spine), whatever the budgets."""
    searched = [s for s in all_shapes(depth) if s.spine in spines and s.budget in budgets]
    chains = [chain(depth), *(TreeShape(depth, 1, spine) for spine in spines)]
    return searched + [c for c in dict.fromkeys(chains) if c not in searched] if searched else []


def replay(steps: Steps) -> Replay:
    """Each step's continuation, from its committed tokens and the following steps' of its request.

    A request's text runs on only through consecutive step numbers: a gap (steps not traced)
    ends what is known, so a continuation never jumps over tokens nobody recorded.
    """
    order = torch.argsort(steps.step, stable=True)
    order = order[torch.argsort(steps.request[order], stable=True)]
    request, number, committed = steps.request[order], steps.step[order], steps.committed[order]
    width = committed.shape[1]
    kept = committed >= 0
    counts = kept.sum(dim=1)
    stream = committed[kept]  # every request's committed text, in (request, step) order
    ends = counts.cumsum(0)
    starts = ends - counts
    continues = torch.zeros_like(kept[:, 0])
    continues[1:] = (request[1:] == request[:-1]) & (number[1:] == number[:-1] + 1)
    run = torch.cumsum(~continues, 0) - 1  # index of the run of consecutive steps each step is in
    run_end = torch.zeros(int(run[-1]) + 1, dtype=ends.dtype).scatter_reduce(0, run, ends, "amax")[run]
    at = starts.unsqueeze(1) + torch.arange(width)
    known = at < run_end.unsqueeze(1)
    padded = torch.cat([stream, stream.new_full((1,), -1)])  # slot len(stream): an index past every run
    truth = torch.where(known, padded[at.clamp(max=len(stream))], -1)
    keys, which = torch.unique(request, return_inverse=True)
    return Replay(roots=steps.root[order], tokens=steps.tokens[order], logprobs=steps.logprobs[order], truth=truth,
                  short=int((~known[:, -1]).sum()), requests=int(keys.numel()),
                  served_scale=_served_scale(which, number, counts, int(keys.numel())))


def _served_scale(which: torch.Tensor, number: torch.Tensor, counts: torch.Tensor, requests: int) -> float:
    """(prefill token + decode tokens) / decode tokens, summed over the requests whose steps run
    0, 1, ... without a gap; which [S] each step's request index, number [S], counts [S] its tokens."""
    ones = torch.ones_like(number)
    steps = torch.zeros(requests, dtype=number.dtype).scatter_add(0, which, ones)
    first = torch.full((requests,), torch.iinfo(number.dtype).max, dtype=number.dtype).scatter_reduce(
        0, which, number, "amin")
    last = torch.zeros(requests, dtype=number.dtype).scatter_reduce(0, which, number, "amax")
    decoded = torch.zeros(requests, dtype=counts.dtype).scatter_add(0, which, counts)[(first == 0) & (last + 1 == steps)]
    total = int(decoded.sum())
    return (total + decoded.numel()) / total if total else 1.0


def check_drafts(rep: Replay, where: str) -> None:
    """The builder's preconditions on the traced log-probs, checked once for every shape."""
    lp = rep.logprobs
    bad = ((~lp.isfinite()) | (lp > 0)).flatten(1).any(1) | (lp[..., 1:] > lp[..., :-1]).flatten(1).any(1)
    if bool(bad.any()):
        raise UserError(f"{where}: {int(bad.sum())} of {rep.steps} steps carry draft log-probs that are not finite, "
                        "not <= 0 or not descending per depth (not written by the DDTree trace writer)")


def committed_per_step(rep: Replay, shape: TreeShape) -> torch.Tensor:
    """[S] tokens each traced step would have committed under `shape` (accepted drafts + bonus)."""
    return committed_per_root(DraftTopK(rep.tokens, rep.logprobs, rep.truth, rep.roots), shape)


def as_served(table: dict[TreeShape, float], rep: Replay) -> dict[TreeShape, float]:
    """Per-step means as SGLang counts acceptance: every shape decodes the same requests, so one
    scale holds for all."""
    return {shape: value * rep.served_scale for shape, value in table.items()}


def acceptance(rep: Replay, shapes: list[TreeShape],
               on_shape: Callable[[int], None] | None = None) -> dict[TreeShape, float]:
    """Mean committed tokens per traced step of every shape; on_shape(done) after each."""
    table = {}
    for done, shape in enumerate(shapes, 1):
        table[shape] = float(committed_per_step(rep, shape).double().mean())
        if on_shape is not None:
            on_shape(done)
    return table

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

The trace is read twice, chunk by chunk, so memory follows the number of steps, not the file:
`replay` keeps each step's continuation (D + 1 tokens), `acceptance` streams the drafts past
it and keeps sums per shape. One pass of the drafts serves every budget of a topk
(core.acceptance.committed_every_budget).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from k26_ddtree.core.acceptance import DraftTopK, TreeShape, committed_every_budget
from k26_ddtree.core.budget import codes_fit, max_budget
from k26_ddtree.errors import UserError
from k26_ddtree.sglang.common.trace import TOPK, Records, steps_of

BUDGETS = range(1, 65)
TOPKS = range(1, TOPK + 1)
# The resampling units of the intervals: requests, pooled by index into at most this many groups,
# so the per-group sums stay a few MB whatever the trace holds.
GROUPS = 4096
# A drafter of the served model ranks the committed token first at depth 1 in about half the steps
# or more; a trace of another vocabulary or model does so by chance only.
MIN_FIRST_HITS = 0.05


@dataclass(frozen=True)
class Replay:
    """Each traced step's continuation, in file order.

    truth [S, D + 1] int32: the tokens after the step's root, -1 past the request's known text
    group [S]: the resampling group of each step's request (request index % GROUPS)
    short: steps whose known text ends before D + 1 tokens; requests: distinct requests
    served_scale: completion tokens over decode-step tokens of the requests traced from their
    first step on without a gap (1 when there is none)
    first_hits: steps whose drafter ranked the token the step committed first at depth 1
    """

    depth: int
    truth: torch.Tensor
    group: torch.Tensor
    short: int
    requests: int
    served_scale: float
    first_hits: int

    @property
    def steps(self) -> int:
        return self.truth.shape[0]

    @property
    def groups(self) -> int:
        return min(self.requests, GROUPS)


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


def replay(records: Records) -> Replay:
    """Each step's continuation, from its committed tokens and the following steps' of its request;
    UserError for records the trace writer does not write.

    A request's text runs on only through consecutive step numbers: a gap (steps not traced)
    ends what is known, so a continuation never jumps over tokens nobody recorded.
    """
    where = str(records.path)
    request, number, committed, first = [], [], [], []
    bad_drafts = bad_commits = 0
    for rows in records.chunks():
        request.append(torch.from_numpy(rows["request"].astype(np.int64)))
        number.append(torch.from_numpy(rows["step"].astype(np.int64)))
        done = torch.from_numpy(rows["committed"].copy())
        committed.append(done)
        first.append(torch.from_numpy(rows["tokens"][:, 0].astype(np.int64)))
        bad_drafts += _bad_drafts(torch.from_numpy(rows["logprobs"].copy()).view(len(rows), records.depth, TOPK))
        # Every step commits at least its bonus token, and -1 only pads after the last one.
        kept = done >= 0
        bad_commits += int((~kept[:, 0] | (kept[:, 1:] & ~kept[:, :-1]).any(1) | (done < -1).any(1)).sum())
    steps = records.count
    if bad_drafts:
        raise UserError(f"{where}: {bad_drafts} of {steps} steps carry draft log-probs that are not finite, "
                        "not <= 0 or not descending per depth (not written by the DDTree trace writer)")
    if bad_commits:
        raise UserError(f"{where}: {bad_commits} of {steps} steps commit no token or hold a token id below 0 "
                        "(not written by the DDTree trace writer: every step commits at least one token)")
    committed = torch.cat(committed)
    hits = int((torch.cat(first) == committed[:, 0]).sum())
    return _continuations(torch.cat(request), torch.cat(number), committed, records.depth, hits, where)


def _bad_drafts(lp: torch.Tensor) -> int:
    """Steps whose log-probs the tree builder cannot take (it checks none of them itself here)."""
    bad = ((~lp.isfinite()) | (lp > 0)).flatten(1).any(1) | (lp[..., 1:] > lp[..., :-1]).flatten(1).any(1)
    return int(bad.sum())


def _continuations(request: torch.Tensor, number: torch.Tensor, committed: torch.Tensor, depth: int, hits: int,
                   where: str) -> Replay:
    order = torch.argsort(number, stable=True)
    order = order[torch.argsort(request[order], stable=True)]
    request_s, number_s, committed_s = request[order], number[order], committed[order]
    repeated = int(((request_s[1:] == request_s[:-1]) & (number_s[1:] == number_s[:-1])).sum())
    if repeated:
        raise UserError(f"{where}: {repeated} records repeat the request and decode step of another (the trace "
                        "writer records each step of a request once)")
    width = depth + 1
    kept = committed_s >= 0
    counts = kept.sum(dim=1)
    stream = committed_s[kept]  # every request's committed text, in (request, step) order
    ends = counts.cumsum(0)
    starts = ends - counts
    continues = torch.zeros_like(kept[:, 0])
    continues[1:] = (request_s[1:] == request_s[:-1]) & (number_s[1:] == number_s[:-1] + 1)
    run = torch.cumsum(~continues, 0) - 1  # index of the run of consecutive steps each step is in
    run_end = torch.zeros(int(run[-1]) + 1, dtype=ends.dtype).scatter_reduce(0, run, ends, "amax")[run]
    at = starts.unsqueeze(1) + torch.arange(width)
    known = at < run_end.unsqueeze(1)
    padded = torch.cat([stream, stream.new_full((1,), -1)])  # slot len(stream): an index past every run
    truth = torch.empty(len(order), width, dtype=torch.int32)
    truth[order] = torch.where(known, padded[at.clamp(max=len(stream))], -1)
    keys, which = torch.unique(request_s, return_inverse=True)
    group = torch.empty_like(which)
    group[order] = which % GROUPS
    return Replay(depth=depth, truth=truth, group=group, short=int((~known[:, -1]).sum()),
                  requests=int(keys.numel()),
                  served_scale=_served_scale(which, number_s, counts, int(keys.numel())), first_hits=hits)


def check_first_hits(rep: Replay, where: str) -> None:
    """Refuse a trace whose drafts are not of the text it committed: the acceptance of every shape
    would then be the bonus token alone, and the plan would rank shapes on cost noise."""
    share = rep.first_hits / rep.steps
    if share < MIN_FIRST_HITS:
        raise UserError(f"{where} is not a trace of the served model: its drafter's first choice at depth 1 is the "
                        f"token the step committed in {100 * share:.1f}% of {rep.steps} steps (a drafter of the "
                        f"served model: about half or more; refused under {100 * MIN_FIRST_HITS:.0f}%)")


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


@dataclass(frozen=True)
class Acceptance:
    """Committed tokens of every shape, summed per resampling group of the trace's requests.

    shapes; sums [groups, len(shapes)]; steps [groups]"""

    shapes: list[TreeShape]
    sums: torch.Tensor
    steps: torch.Tensor

    def means(self) -> dict[TreeShape, float]:
        """Mean committed tokens per traced step of every shape."""
        total = self.sums.sum(0).double() / float(self.steps.sum())
        return dict(zip(self.shapes, total.tolist()))


def acceptance(records: Records, rep: Replay, shapes: list[TreeShape],
               on_steps: Callable[[int], None] | None = None) -> Acceptance:
    """Every shape's committed tokens over the traced steps, one pass of the drafts;
    on_steps(done) after each chunk of steps."""
    by_topk: dict[int, list[tuple[int, TreeShape]]] = {}
    for column, shape in enumerate(shapes):
        by_topk.setdefault(shape.topk, []).append((column, shape))
    # Per topk: its largest budget, the shapes' columns and where each lies in committed_every_budget's
    # [2, A, budget] output, read as [A, 2 * budget].
    plans = []
    for topk, columns in by_topk.items():
        widest = max(shape.budget for _, shape in columns)
        picks = torch.tensor([int(shape.spine) * widest + shape.budget - 1 for _, shape in columns])
        plans.append((topk, widest, torch.tensor([column for column, _ in columns]), picks))
    # Summed in the order of the plans' columns (one block per topk), put back in shapes' order once at the end.
    order = torch.cat([columns for _, _, columns, _ in plans])
    sums = torch.zeros(rep.groups, len(shapes), dtype=torch.long)
    steps = torch.zeros(rep.groups, dtype=torch.long).index_add_(0, rep.group, torch.ones_like(rep.group))
    done = 0
    for rows in records.chunks():
        part = steps_of(rows, rep.depth)
        at = slice(done, done + len(rows))
        draft = DraftTopK(part.tokens, part.logprobs, rep.truth[at].long(), part.root)
        found = torch.cat([
            committed_every_budget(draft, topk, widest).permute(1, 0, 2).reshape(len(rows), 2 * widest)[:, picks]
            for topk, widest, _, picks in plans], dim=1)
        sums.index_add_(0, rep.group[at], found)
        done += len(rows)
        if on_steps is not None:
            on_steps(done)
    in_order = torch.empty_like(sums)
    in_order[:, order] = sums
    return Acceptance(shapes, in_order, steps)


def as_served(table: dict[TreeShape, float], rep: Replay) -> dict[TreeShape, float]:
    """Per-step means as SGLang counts acceptance: every shape decodes the same requests, so one
    scale holds for all."""
    return {shape: value * rep.served_scale for shape, value in table.items()}

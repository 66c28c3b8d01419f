"""The DDTree builder: the `budget` best draft prefixes of every request, batched.

A prefix is a path of top-K ranks (r_1, ..., r_d), one per draft position; its
token at depth d is top_tokens[d - 1, r_d] and its score is the sum of
top_logprobs[e - 1, r_e] for e <= d. Nodes are totally ordered by the key

    (spine node first when spine=True, higher score, shallower, smaller rank path)

where "smaller rank path" compares the paths lexicographically. The tree holds
the first `budget` prefixes in that order; a parent always precedes its
children in it, so the set is ancestor-closed and node i's parent has a
smaller index. Node 0 is the root (the last committed token); nodes 1..budget
appear in key order, which is the order the reference heap pops them.

How the batched builder finds them without enumerating K^D prefixes: the
members of the top set at depth d are the best ones of depth d, and every one
of them extends a member of the top set at depth d - 1 (a prefix that beats
the parent gives, with the same last rank, a child that beats the child). So
each depth keeps only its best min(budget, K^d) prefixes, chosen among the
children of the previous depth's survivors, and one final selection over all
survivors picks the `budget` nodes. Each selection is a top-k over int64 keys
that pack the exact float32 cost bits over the tie-breaking fields, so every
key is unique and no stable sort or epsilon is needed.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache

import torch

# Key layout (int64): bit 63 set marks a spine node (the key turns negative and
# sorts first), bits 31..61 hold the float32 cost (= -score, >= +0.0, whose bit
# pattern grows with the value), bits 0..30 hold
# ((depth - 1) * width + parent slot) * K + rank, which orders equal costs by
# depth, then by rank path, and decodes to the parent's slot in the key table.
_COST_SHIFT = 31
_LOW_MASK = (1 << _COST_SHIFT) - 1
_SPINE_BIT = -(1 << 63)
# Above every real key; a power of two, so F.pad's float fill value carries it exactly.
_PAD_KEY = 1 << 62


@dataclass
class DDTree:
    """A batch of draft trees, B requests with N = budget + 1 nodes each.

    tokens     [B, N] long   token of every node; node 0 is the root
    parents    [B, N] long   parent's local index, -1 for the root; parents[:, i] < i
    depths     [B, N] long   0 for the root, 1..max_depth for draft nodes
    node_logws [B, N] float  path score (sum of draft log-probs), 0.0 for the root
    max_depth  int or None   depth cap D (draft positions); None = read from depths
    best_first bool          siblings appear in descending node_logws order by
                             index (build_ddtree guarantees it; hand-made trees
                             leave it False and get sorted where it matters)
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    node_logws: torch.Tensor
    max_depth: int | None = None
    best_first: bool = False

    @property
    def batch_size(self) -> int:
        return self.tokens.shape[0]

    @property
    def num_nodes(self) -> int:
        return self.tokens.shape[1]

    def depth_cap(self) -> int:
        """D, the longest path a verify walk can take; reads depths (a host sync) when unset."""
        if self.max_depth is not None:
            return self.max_depth
        return int(self.depths.max()) if self.depths.numel() else 0


def max_budget(depth: int, topk: int) -> int:
    """Number of distinct prefixes of length 1..depth over topk ranks: sum of topk^d."""
    return sum(topk**d for d in range(1, depth + 1))


@dataclass(frozen=True)
class _Plan:
    survivors: tuple[int, ...]  # best prefixes kept at depth 1..D
    width: int  # slots per depth in the merged key table (max survivors)
    spine_len: int


@lru_cache(maxsize=256)
def _plan(depth: int, topk: int, budget: int, spine: bool) -> _Plan:
    survivors = []
    kept = 1
    for _ in range(depth):
        kept = min(budget, kept * topk)
        survivors.append(kept)
    width = max(survivors)
    if depth * width * topk > 1 << _COST_SHIFT:
        raise ValueError(
            f"budget {budget} with topk {topk} and {depth} draft positions is too large for the"
            " tie-breaking key (needs depth * budget * topk <= 2^31)"
        )
    return _Plan(tuple(survivors), width, min(depth, budget) if spine else 0)


def _check_inputs(root_tokens, top_tokens, top_logprobs, budget, validate: bool) -> int:
    """Raise ValueError naming the first problem; return the budget as an int."""
    for name, t in (("root_tokens", root_tokens), ("top_tokens", top_tokens), ("top_logprobs", top_logprobs)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if root_tokens.dim() != 1:
        raise ValueError(f"root_tokens must be [B], got shape {tuple(root_tokens.shape)}")
    if top_tokens.dim() != 3:
        raise ValueError(f"top_tokens must be [B, D, K], got shape {tuple(top_tokens.shape)}")
    if top_logprobs.shape != top_tokens.shape:
        raise ValueError(
            f"top_logprobs shape {tuple(top_logprobs.shape)} does not match top_tokens shape {tuple(top_tokens.shape)}"
        )
    if top_tokens.shape[0] != root_tokens.shape[0]:
        raise ValueError(
            f"batch size mismatch: root_tokens has {root_tokens.shape[0]} rows, top_tokens {top_tokens.shape[0]}"
        )
    if root_tokens.dtype != torch.long or top_tokens.dtype != torch.long:
        raise ValueError(
            f"root_tokens and top_tokens must be torch.long, got {root_tokens.dtype} and {top_tokens.dtype}"
        )
    if not top_logprobs.dtype.is_floating_point:
        raise ValueError(f"top_logprobs must be a floating-point tensor, got {top_logprobs.dtype}")
    if not (root_tokens.device == top_tokens.device == top_logprobs.device):
        raise ValueError(
            f"inputs on different devices: {root_tokens.device}, {top_tokens.device}, {top_logprobs.device}"
        )
    _, depth, topk = top_tokens.shape
    if depth < 1 or topk < 1:
        raise ValueError(f"need at least one draft position and one candidate, got D={depth}, K={topk}")
    try:
        if isinstance(budget, bool):
            raise TypeError
        budget = operator.index(budget)
    except TypeError:
        raise ValueError(f"budget must be an int, got {budget!r}") from None
    limit = max_budget(depth, topk)
    if not 1 <= budget <= limit:
        raise ValueError(f"budget {budget} out of range: must be 1..{limit} (sum of K^d for K={topk}, D={depth})")
    if validate and top_logprobs.numel():
        lp = top_logprobs.float()
        finite, nonpositive, descending = torch.stack(
            [lp.isfinite().all(), (lp <= 0).all(), (lp[..., 1:] <= lp[..., :-1]).all()]
        ).tolist()
        if not finite:
            raise ValueError("top_logprobs contains non-finite values (nan or inf)")
        if not nonpositive:
            raise ValueError("top_logprobs contains positive values; log-probabilities must be <= 0")
        if not descending:
            raise ValueError("top_logprobs is not descending along K (the top-K axis)")
    return budget


def build_ddtree(
    root_tokens: torch.Tensor,
    top_tokens: torch.Tensor,
    top_logprobs: torch.Tensor,
    budget: int,
    *,
    spine: bool = False,
    validate: bool = True,
) -> DDTree:
    """Build the DDTree of the `budget` best draft prefixes for every request.

    root_tokens [B] long, top_tokens [B, D, K] long, top_logprobs [B, D, K] float
    (descending along K, <= 0). Scores are summed in float32. spine=True always
    keeps the rank-0 chain down to depth min(D, budget) and fills the rest
    best-first. validate=False skips the value checks (their host sync) so the
    call can be captured in a CUDA graph; shapes, dtypes and budget are always
    checked, since that costs nothing on the device.
    """
    budget = _check_inputs(root_tokens, top_tokens, top_logprobs, budget, validate)
    batch, depth, topk = top_tokens.shape
    plan = _plan(depth, topk, budget, spine)
    width = plan.width
    device = top_tokens.device

    # Costs are -score, non-negative; `0.0 - x` (not `-x`) turns -0.0 into +0.0 so
    # the bit pattern stays monotone. Rounding is symmetric, so the costs are the
    # exact negations of the scores the reference heap sums.
    step_cost = 0.0 - top_logprobs.float()
    lex = torch.arange(depth * width * topk, device=device).view(depth, width * topk)

    cost = torch.zeros(batch, 1, device=device)
    # The key table: row 0 stands for depth 0 (the root, slot 0), row d holds
    # depth d's survivors in `width` slots, so a key's low bits // K is its
    # parent's flat slot. The last depth feeds no further depth: its candidates
    # go into the table unselected, one row that runs past `width`.
    level_keys = [torch.full((batch, width), _PAD_KEY, dtype=torch.long, device=device)]
    for d in range(depth):
        cand_cost = (cost.unsqueeze(2) + step_cost[:, d, None, :]).flatten(1)
        n_cand = cand_cost.shape[1]
        key = torch.add(lex[d, :n_cand], cand_cost.view(torch.int32), alpha=1 << _COST_SHIFT)
        keep = plan.survivors[d]
        if d < depth - 1 and keep < n_cand:
            # Survivors go back to rank-path order, so the next depth's candidate
            # index (slot * K + rank) keeps ordering ties by rank path.
            chosen = key.topk(keep, dim=1, largest=False, sorted=False).indices.sort(dim=1).values
            key = key.gather(1, chosen)
            cand_cost = cand_cost.gather(1, chosen)
        if key.shape[1] < width:
            key = torch.nn.functional.pad(key, (0, width - key.shape[1]), value=_PAD_KEY)
        level_keys.append(key)
        cost = cand_cost

    keys = torch.cat(level_keys, dim=1)
    if plan.spine_len:
        # Slot 0 of every depth is the rank-0 chain: it is the best and the
        # rank-path-smallest prefix of its depth, so it always survives there.
        keys[:, width : (plan.spine_len + 1) * width : width] |= _SPINE_BIT
    picked = keys.topk(budget, dim=1, largest=False, sorted=True)
    key = picked.values

    low = key & _LOW_MASK
    node_depths = (picked.indices // width).clamp(max=depth)
    node_of_slot = torch.zeros_like(keys)
    node_of_slot.scatter_(1, picked.indices, torch.arange(1, budget + 1, device=device).expand(batch, budget))
    parents = node_of_slot.gather(1, low // topk)
    token_index = torch.add(low % topk, node_depths - 1, alpha=topk)
    tokens = top_tokens.reshape(batch, depth * topk).gather(1, token_index)
    # Bits 31..62 of the key, truncated to 32 bits: the cost's float32 pattern.
    costs = (key >> _COST_SHIFT).int().view(torch.float32)

    return DDTree(
        tokens=torch.cat([root_tokens.unsqueeze(1), tokens], dim=1),
        parents=torch.nn.functional.pad(parents, (1, 0), value=-1),
        depths=torch.nn.functional.pad(node_depths, (1, 0), value=0),
        node_logws=torch.nn.functional.pad(0.0 - costs, (1, 0), value=0.0),
        max_depth=depth,
        best_first=True,
    )

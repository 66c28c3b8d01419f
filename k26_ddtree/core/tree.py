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
tree is the root plus the `budget` smallest keys, a set closed under taking
parents (a child's key exceeds its parent's). A tree node at depth d comes
with the root, its d - 1 ancestors and every better prefix of its own depth,
so it is among the m_d = budget - d + 1 best prefixes of its depth (spine
nodes, forced in, only add to that count), and its parent is a tree node of
depth d - 1. So each depth keeps the best min(m_d, P * K) of the children of
the previous depth's P survivors, sorted, and one final sort over all depths'
survivors orders the tree. The argument uses only the order of the keys, and
subtracting a log-prob <= 0 from a float32 cost never lowers it, so it holds
exactly for the float32 sums.

Every prefix is one int64 key whose high 32 bits are the float32 cost
(= -score, >= +0.0, whose bit pattern grows with the value) and whose low 32
bits are its path code: 1 for the root, parent_code * max(K, 2) + rank for a
child. Codes grow with depth and, within a depth, with the rank path, so the
keys are unique and order prefixes exactly by (cost, depth, rank path); a code
also names its parent (code // max(K, 2)) and its rank (code % max(K, 2)), so
no parent pointers are carried.

This torch builder is a fixed sequence of ops for a shape (three per depth
and about a dozen more) whatever the data, and runs on any device. On CUDA
tensors build_ddtree runs the same algorithm as one fused Triton kernel
instead (tree_kernel.py), bit for bit the same tree: at serving batch sizes
dozens of small launches and int64 sorts cost more than the work.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from functools import lru_cache

import torch

from k26_ddtree.core.budget import codes_fit, max_budget
from k26_ddtree.core.fused import fused_kernel

# A key is read back as two 32-bit words (little-endian: word 0 is the low
# half): the path code as int32, the cost as float32; budget.codes_fit keeps
# codes below 2^31.
# Added to the keys of the root and the spine nodes so they rank first.
_SPINE_BIT = -(1 << 63)


@dataclass
class DDTree:
    """A batch of draft trees, B requests with N = budget + 1 nodes each: N is the verify width,
    the tokens one request puts through the target's verify.

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
    def verify_width(self) -> int:
        """N = budget + 1: the root and the budget's draft nodes."""
        return self.tokens.shape[1]

    def depth_cap(self) -> int:
        """D, the longest path a verify walk can take; reads depths (a host sync) when unset."""
        if self.max_depth is not None:
            return self.max_depth
        return int(self.depths.max()) if self.depths.numel() else 0


@dataclass(frozen=True)
class _Plan:
    base: int  # code radix, max(K, 2) so that a child's code differs from its parent's
    kept: tuple[int, ...]  # survivors per depth 1..min(D, budget), min(m_d, P * K); deeper depths hold no node
    offsets: tuple[int, ...]  # where each depth's survivors start in the final table (root at 0)
    spine_len: int

    @property
    def table_size(self) -> int:
        return 1 + sum(self.kept)


@lru_cache(maxsize=256)
def _plan(depth: int, topk: int, budget: int, spine: bool) -> _Plan:
    levels = min(depth, budget)
    base = max(topk, 2)
    kept, offsets = [], []
    survivors, offset = 1, 1
    for d in range(1, levels + 1):
        survivors = min(survivors * topk, budget - d + 1)
        kept.append(survivors)
        offsets.append(offset)
        offset += survivors
    return _Plan(base, tuple(kept), tuple(offsets), levels if spine else 0)


def plan_levels(depth: int, topk: int, budget: int) -> tuple[int, tuple[int, ...]]:
    """(code radix, survivors per depth 1..min(D, budget)) of a tree shape, for the fused kernel."""
    plan = _plan(depth, topk, budget, False)
    return plan.base, plan.kept


@dataclass(frozen=True)
class _Constants:
    root_key: torch.Tensor  # [1, 1] long: cost 0.0, code 1
    child_rank: torch.Tensor  # [K] int32: 0..K-1, the code digit of each rank
    spine_keys: torch.Tensor | None  # [T] long: _SPINE_BIT at the root and spine slots, else 0
    node_info: torch.Tensor  # [2, T] long per table slot: depth; token column base
    no_parent: torch.Tensor  # 0-dim long -1 (a Python -1 in torch.where costs a fill kernel)


@lru_cache(maxsize=None)
def _constants(depth: int, topk: int, budget: int, spine: bool, device: torch.device) -> _Constants:
    """Device constants of one tree shape, made once (so CUDA graph capture after a
    warm-up call finds them ready) and never written to; never evicted either, since
    captured graphs read them."""
    plan = _plan(depth, topk, budget, spine)
    size = plan.table_size
    depths = [0] + [d + 1 for d, n in enumerate(plan.kept) for _ in range(n)]
    # Token of a node = row [root_token, top_tokens flattened][token_base + rank];
    # the root's code 1 has rank 1 % base = 1, hence its base -1.
    token_base = [-1] + [1 + (d - 1) * topk for d in depths[1:]]
    spine_keys = None
    if plan.spine_len:
        # The rank-0 chain's prefix is the best of its depth: slot 0 of every sorted row.
        spine_keys = torch.zeros(size, dtype=torch.long)
        spine_keys[[0, *plan.offsets[: plan.spine_len]]] = _SPINE_BIT
        spine_keys = spine_keys.to(device)
    return _Constants(
        root_key=torch.ones(1, 1, dtype=torch.long, device=device),
        child_rank=torch.arange(topk, dtype=torch.int32, device=device),
        spine_keys=spine_keys,
        node_info=torch.tensor([depths, token_base], dtype=torch.long, device=device),
        no_parent=torch.tensor(-1, device=device),
    )


def _costs(keys: torch.Tensor) -> torch.Tensor:
    """The float32 cost words of int64 keys, as a strided view."""
    return keys.view(torch.float32)[..., 1::2]


def _codes(keys: torch.Tensor) -> torch.Tensor:
    """The int32 path-code words of int64 keys, as a strided view."""
    return keys.view(torch.int32)[..., 0::2]


def child_keys(survivors: torch.Tensor, logprobs: torch.Tensor, child_rank: torch.Tensor, base: int) -> torch.Tensor:
    """[B, P * K] keys of every child of the [B, P] survivor keys, parent-major;
    logprobs [B, K] are the child depth's float32 log-probs."""
    batch, parents = survivors.shape
    topk = logprobs.shape[1]
    children = torch.empty(batch, parents * topk, dtype=torch.long, device=survivors.device)
    words = children.view(torch.int32).view(batch, parents, topk, 2)
    # Subtracting a log-prob <= 0 from a cost >= +0.0 is the float32 sum the reference
    # heap makes and never yields -0.0, so cost bit patterns stay monotone.
    torch.sub(_costs(survivors).unsqueeze(2), logprobs.unsqueeze(1), out=words[..., 1].view(torch.float32))
    torch.add(child_rank, _codes(survivors).unsqueeze(2), alpha=base, out=words[..., 0])
    return children


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
    if not codes_fit(depth, topk, budget):
        raise ValueError(
            f"topk {topk} with {min(depth, budget)} draft positions in the tree is too large for the"
            " tie-breaking key (needs max(topk, 2)^min(D, budget) <= 2^30)"
        )
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
    fused: bool | None = None,
) -> DDTree:
    """Build the DDTree of the `budget` best draft prefixes for every request.

    root_tokens [B] long, top_tokens [B, D, K] long, top_logprobs [B, D, K] float
    (descending along K, <= 0). Scores are summed in float32. spine=True always
    keeps the rank-0 chain down to depth min(D, budget) and fills the rest
    best-first. validate=False skips the value checks (their host sync) so the
    call can be captured in a CUDA graph; shapes, dtypes and budget are always
    checked, since that costs nothing on the device. The first call for a shape
    and device copies a few constants to it, so make one before capturing.
    fused: whether the fused Triton kernel (tree_kernel.py) runs instead of the
    torch ops; None (default) runs it for CUDA tensors (k26_ddtree.core.fused).
    """
    budget = _check_inputs(root_tokens, top_tokens, top_logprobs, budget, validate)
    batch, depth, topk = top_tokens.shape
    logprobs = top_logprobs.float()
    kernel = fused_kernel(fused, top_tokens, budget + 1, "core.tree_kernel", "build_ddtree_fused")
    if kernel is not None:
        return kernel(root_tokens, top_tokens, logprobs, budget, spine)
    plan = _plan(depth, topk, budget, spine)
    const = _constants(depth, topk, budget, spine, top_tokens.device)

    survivors = const.root_key.expand(batch, 1)
    levels = [survivors]
    for d, kept in enumerate(plan.kept):
        children = child_keys(survivors, logprobs[:, d], const.child_rank, plan.base)
        # One parent's children come in rank order, which is key order.
        survivors = (children if survivors.shape[1] == 1 else children.sort(dim=1).values)[:, :kept]
        levels.append(survivors)

    table = torch.cat(levels, dim=1)
    if const.spine_keys is not None:
        table = table + const.spine_keys
    n = budget + 1
    keys, slots = (t[:, :n] for t in table.sort(dim=1))
    info = const.node_info[:, slots]

    codes = _codes(keys)
    token_index = info[1] + codes % plan.base
    tokens = torch.cat([root_tokens.unsqueeze(1), top_tokens.reshape(batch, depth * topk)], dim=1).gather(1, token_index)
    # The root's parent code 0 names no node; every other node's names exactly one.
    found, parents = (codes.unsqueeze(2) // plan.base == codes.unsqueeze(1)).max(dim=2)
    # A spine key's cost word carries the spine bit as its sign.
    costs = _costs(keys).abs() if const.spine_keys is not None else _costs(keys)

    return DDTree(
        tokens=tokens,
        parents=torch.where(found, parents, const.no_parent),
        depths=info[0],
        node_logws=0.0 - costs,
        max_depth=depth,
        best_first=True,
    )

"""build_ddtree as one fused Triton kernel: the GPU fast path, one program per request.

It computes exactly what the torch builder in tree.py computes, with the same
int64 keys (float32 cost bits over the path code) and the same float32 sums,
so the two agree bit for bit; tree.py documents the algorithm. The difference
is the cost model: the torch builder is dozens of small kernels (and its int64
sorts cost tens of µs each on the GPU), this is one launch in which each
request sorts its rows in registers:

  depth d   the children of the previous depth's P survivors, a [P, K] block
            of keys, sorted; the first min(budget - d + 1, P * K) are this
            depth's survivors, stored in the request's scratch row
  final     the scratch row (root + every depth's survivors) sorted, spine
            nodes first; its first N = budget + 1 keys are the tree: depth
            from the code's magnitude, rank from its last digit, token by
            (depth, rank), parent by matching code // base among the N codes

The scratch row is global memory (L1/L2 resident at these sizes), so each
write-then-read is fenced by a block barrier. Works under CUDA graph capture
(fixed shapes, no host sync) and, for the tests, in Triton's CPU interpreter
(TRITON_INTERPRET=1).
"""

from __future__ import annotations

from functools import lru_cache

import torch
import triton
import triton.language as tl

from k26_ddtree.core.tree import DDTree, plan_levels


@triton.jit
def _build_kernel(
    root_ptr,  # [B] long
    tokens_ptr,  # [B, D, K] long, contiguous
    logprobs_ptr,  # [B, D, K] float32, contiguous
    kept_ptr,  # [LEVELS] int32: survivors per depth
    scratch_ptr,  # [B, T_PAD] int64
    out_tokens_ptr,  # [B, N] long
    out_parents_ptr,  # [B, N] long
    out_depths_ptr,  # [B, N] long
    out_logws_ptr,  # [B, N] float32
    D: tl.constexpr,
    K: tl.constexpr,
    BASE: tl.constexpr,
    N: tl.constexpr,
    LEVELS: tl.constexpr,
    SPINE: tl.constexpr,
    P_PAD: tl.constexpr,
    K_PAD: tl.constexpr,
    T_PAD: tl.constexpr,
    N_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = scratch_ptr + b * T_PAD
    biggest = tl.full([], 0x7FFFFFFFFFFFFFFF, tl.int64)
    low_word = tl.full([], 0xFFFFFFFF, tl.int64)

    slot = tl.arange(0, P_PAD)[:, None]
    rank = tl.arange(0, K_PAD)[None, :]
    flat = tl.arange(0, P_PAD * K_PAD)
    table = tl.arange(0, T_PAD)
    # The root: cost +0.0, code 1. It is always on the spine.
    tl.store(row, tl.full([], 1, tl.int64))
    spine = table == 0
    parents_at = 0
    parents = 1
    start = 1
    for d in tl.static_range(LEVELS):
        tl.debug_barrier()
        parent_keys = tl.load(row + parents_at + slot, mask=slot < parents, other=0)
        parent_costs = (parent_keys >> 32).to(tl.int32).to(tl.float32, bitcast=True)
        logprobs = tl.load(logprobs_ptr + (b * D + d) * K + rank, mask=rank < K, other=0.0)
        # Cost >= +0.0 minus log-prob <= 0: the reference's float32 sum, never -0.0.
        costs = parent_costs - logprobs
        codes = (parent_keys & low_word) * BASE + rank
        keys = (costs.to(tl.int32, bitcast=True).to(tl.int64) << 32) | codes
        keys = tl.where((slot < parents) & (rank < K), keys, biggest)
        kept = tl.load(kept_ptr + d)
        tl.store(row + start + flat, tl.sort(tl.reshape(keys, [P_PAD * K_PAD])), mask=flat < kept)
        if SPINE:
            # The rank-0 chain is the best prefix of its depth: slot 0 of the sorted row.
            spine = spine | (table == start)
        parents_at = start
        parents = kept
        start = start + kept

    tl.debug_barrier()
    keys = tl.load(row + table, mask=table < start, other=biggest)
    if SPINE:
        keys = tl.where(spine, keys | (tl.full([], 1, tl.int64) << 63), keys)
    tl.debug_barrier()
    tl.store(row + table, tl.sort(keys), mask=table < N)
    tl.debug_barrier()

    node = tl.arange(0, N_PAD)
    in_tree = node < N
    keys = tl.load(row + node, mask=in_tree, other=0) & biggest
    costs = (keys >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    codes = (keys & low_word).to(tl.int32)
    # A depth-e code lies in [BASE^e, 2 * BASE^e).
    depths = tl.zeros([N_PAD], dtype=tl.int64)
    bound = BASE
    for _ in tl.static_range(LEVELS):
        depths += (codes >= bound).to(tl.int64)
        bound = bound * BASE
    ranks = codes % BASE
    drafted = tl.load(
        tokens_ptr + (b * D + depths - 1) * K + ranks, mask=in_tree & (depths > 0), other=0
    )
    tokens = tl.where(depths == 0, tl.load(root_ptr + b), drafted)
    # The root's parent code 0 matches no node; every other node's matches exactly one.
    column = tl.arange(0, N_PAD)[None, :]
    match = ((codes // BASE)[:, None] == codes[None, :]) & (column < N)
    found = tl.min(tl.where(match, column, N_PAD), axis=1)
    parents = tl.where(found < N_PAD, found, -1).to(tl.int64)

    out = b * N + node
    tl.store(out_tokens_ptr + out, tokens, mask=in_tree)
    tl.store(out_parents_ptr + out, parents, mask=in_tree)
    tl.store(out_depths_ptr + out, depths, mask=in_tree)
    tl.store(out_logws_ptr + out, 0.0 - costs, mask=in_tree)


def _pow2(n: int) -> int:
    return max(2, triton.next_power_of_2(n))


@lru_cache(maxsize=None)
def _kept(kept: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """The per-depth survivor counts as a device tensor, made once per shape (so CUDA
    graph capture after a warm-up call finds it ready), never written to and never
    evicted (captured graphs read it)."""
    return torch.tensor(kept, dtype=torch.int32, device=device)


def build_ddtree_fused(
    root_tokens: torch.Tensor, top_tokens: torch.Tensor, logprobs: torch.Tensor, budget: int, spine: bool
) -> DDTree:
    """build_ddtree's result from one kernel launch. Inputs as build_ddtree takes them,
    already checked; logprobs in float32."""
    batch, depth, topk = top_tokens.shape
    base, kept = plan_levels(depth, topk, budget)
    n = budget + 1
    device = top_tokens.device
    table_pad = _pow2(1 + sum(kept))
    out = torch.empty(3, batch, n, dtype=torch.long, device=device)
    logws = torch.empty(batch, n, dtype=torch.float32, device=device)
    if batch:
        _build_kernel[(batch,)](
            # The kernel indexes flat rows; a root column sliced out of a block is strided.
            root_tokens.contiguous(),
            top_tokens.contiguous(),
            logprobs.contiguous(),
            _kept(kept, device),
            torch.empty(batch, table_pad, dtype=torch.long, device=device),
            out[0],
            out[1],
            out[2],
            logws,
            D=depth,
            K=topk,
            BASE=base,
            N=n,
            LEVELS=len(kept),
            SPINE=spine,
            P_PAD=_pow2(max((1, *kept[:-1]))),
            K_PAD=_pow2(topk),
            T_PAD=table_pad,
            N_PAD=_pow2(n),
            num_warps=8 if n > 64 else 4,
        )
    return DDTree(
        tokens=out[0], parents=out[1], depths=out[2], node_logws=logws, max_depth=depth, best_first=True
    )

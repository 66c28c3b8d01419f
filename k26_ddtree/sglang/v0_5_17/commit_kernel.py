"""The 0.5.17 commit (ddtree_utils.commit_step's torch ops, which define it) as one fused Triton
kernel. As torch ops it is 49 operator calls a step, 33 of them more than views, and on the
overlap worker their launches lengthen the step wherever its GPU work is shorter than the host's.

One program per request reads its packed acceptance row and its nodes' slots, permutes its
req_to_token segment (the path's slots in depth order, then every other node's in node order),
and writes everything the scheduler and the draft KV append take. The batch size and
the strides are not specialised on, so one compiled variant per tree shape serves every batch;
ddtree_utils.warm_up_commit compiles it at start-up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["rows_stride", "req_to_token_stride"])
def _commit_kernel(
    rows_ptr,  # [B, 2P + 1] long, row stride rows_stride: PackedAcceptance.rows
    rows_stride,
    slots_ptr,  # [B, W] long: every node's KV slot before the commit
    pool_ptr,  # [B]: req_to_token row of every request
    prefix_ptr,  # [B]: committed length before this step
    req_to_token_ptr,  # [R, C]
    req_to_token_stride,
    cache_loc_ptr,  # out [B, L] long: the segment's first L = min(W, P) slots
    out_tokens_ptr,  # out [B, P] long: committed tokens, 0 past them
    commit_lens_ptr,  # out [B] int32: accepted drafts + 1
    bonus_ptr,  # out [B] long
    new_seq_lens_ptr,  # out [B], prefix's dtype
    positions_ptr,  # out [B, P] long: prefix + depth
    hidden_rows_ptr,  # out [B, P] long: rows of the [B * W, F] hidden states along the path
    W: tl.constexpr,
    P: tl.constexpr,
    L: tl.constexpr,
    W_PAD: tl.constexpr,
    P_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = rows_ptr + b * rows_stride
    depth = tl.arange(0, P_PAD)
    in_row = depth < P
    committed = tl.load(row + depth, mask=in_row, other=-1)
    path = tl.load(row + P + depth, mask=in_row, other=-1)
    accept_len = tl.load(row + 2 * P)
    commit_len = accept_len + 1
    on_path = depth < commit_len

    nodes = tl.arange(0, W_PAD)
    is_node = nodes < W
    match = (nodes[:, None] == path[None, :]) & on_path[None, :]
    kept = tl.max(match.to(tl.int32), axis=1) > 0
    node_depth = tl.sum(tl.where(match, depth[None, :], 0), axis=1)
    off_path = is_node & (kept == 0)
    rank = tl.cumsum(off_path.to(tl.int32), axis=0) - 1
    position = tl.where(kept, node_depth, commit_len + rank).to(tl.int64)

    slot = tl.load(slots_ptr + b * W + nodes, mask=is_node, other=0)
    pool = tl.load(pool_ptr + b).to(tl.int64)
    prefix64 = tl.load(prefix_ptr + b).to(tl.int64)
    tl.store(cache_loc_ptr + b * L + position, slot, mask=is_node & (position < L))
    tl.store(req_to_token_ptr + pool * req_to_token_stride + prefix64 + position,
             slot.to(req_to_token_ptr.dtype.element_ty), mask=is_node)

    tl.store(out_tokens_ptr + b * P + depth, tl.maximum(committed, 0), mask=in_row)
    tl.store(positions_ptr + b * P + depth, prefix64 + depth, mask=in_row)
    tl.store(hidden_rows_ptr + b * P + depth, b * W + tl.maximum(path, 0), mask=in_row)
    tl.store(commit_lens_ptr + b, commit_len.to(tl.int32))
    tl.store(bonus_ptr + b, tl.sum(tl.where(depth == accept_len, committed, 0)))
    tl.store(new_seq_lens_ptr + b, (prefix64 + commit_len).to(new_seq_lens_ptr.dtype.element_ty))


def commit_fused(rows: torch.Tensor, node_slots: torch.Tensor, req_to_token: torch.Tensor,
                 req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor):
    """ddtree_utils.StepCommit's fields, in its order, from one launch that permutes
    req_to_token[prefix, prefix + W) on the way; rows: PackedAcceptance.rows [B, 2P + 1]."""
    batch, width = node_slots.shape
    span = (rows.shape[1] - 1) // 2
    if req_to_token.stride(1) != 1:
        raise ValueError(f"req_to_token must have contiguous columns, got strides {req_to_token.stride()}")
    if rows.stride(1) != 1:
        rows = rows.contiguous()
    device = node_slots.device
    cache_loc = torch.empty(batch, min(width, span), dtype=torch.long, device=device)
    out_tokens, positions, hidden_rows = (torch.empty(batch, span, dtype=torch.long, device=device) for _ in range(3))
    commit_lens = torch.empty(batch, dtype=torch.int32, device=device)
    bonus = torch.empty(batch, dtype=torch.long, device=device)
    new_seq_lens = torch.empty_like(prefix_lens)
    if batch:
        _commit_kernel[(batch,)](
            rows, rows.stride(0), node_slots.contiguous(), req_pool_indices.contiguous(), prefix_lens.contiguous(),
            req_to_token,
            req_to_token.stride(0), cache_loc, out_tokens, commit_lens, bonus, new_seq_lens, positions,
            hidden_rows,
            W=width, P=span, L=min(width, span), W_PAD=max(2, triton.next_power_of_2(width)), P_PAD=max(2, triton.next_power_of_2(span)),
        )
    return cache_loc, out_tokens, commit_lens, bonus, new_seq_lens, positions.view(-1), hidden_rows.view(-1)


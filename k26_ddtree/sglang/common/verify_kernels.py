"""The DDTree verify's two SGLang-layout steps as fused Triton kernels, one launch each.

Same results as verify_utils.py's torch ops (which define them): the triton
custom mask of the verify forward, and the commit of the accepted paths' KV
slots. As torch ops each is about a dozen small kernels per step, and at serving
batch sizes their launches cost more than the work.

Both read the whole batch's per-request lengths into one block (B_PAD >= B,
rounded up to a power of two of at least 16) to find where their request's
entries start: a prefix sum inside the program. The batch size and the strides
are not specialised on (Triton would compile a variant for B = 1 and for
multiples of 16), so one compiled variant per B_PAD class serves every batch,
and warm_up compiles them all at start-up.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_MASK_BLOCK = 1024


def _batch_pad(batch: int) -> int:
    return max(16, triton.next_power_of_2(batch))


@triton.jit(do_not_specialize=["B"])
def _custom_mask_kernel(
    ancestor_ptr,  # [B, N, N] bool
    prefix_ptr,  # [B] int
    mask_ptr,  # [sum_b N * (prefix_b + N)] bool
    B,
    N: tl.constexpr,
    N_PAD: tl.constexpr,
    B_PAD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    i = tl.program_id(1).to(tl.int64)
    others = tl.arange(0, B_PAD)
    prefixes = tl.load(prefix_ptr + others, mask=others < B, other=0).to(tl.int64)
    start = tl.sum(tl.where(others < b, (prefixes + N) * N, 0))
    prefix = tl.sum(tl.where(others == b, prefixes, 0))
    row = start + i * (prefix + N)
    ones = tl.full([BLOCK], 1, tl.int1)
    for offset in range(0, prefix, BLOCK):
        cols = offset + tl.arange(0, BLOCK)
        tl.store(mask_ptr + row + cols, ones, mask=cols < prefix)
    nodes = tl.arange(0, N_PAD)
    allowed = tl.load(ancestor_ptr + (b * N + i) * N + nodes, mask=nodes < N, other=0)
    tl.store(mask_ptr + row + prefix + nodes, allowed, mask=nodes < N)


def verify_custom_mask_fused(ancestor: torch.Tensor, prefix_lens: torch.Tensor, total: int) -> torch.Tensor:
    """verify_custom_mask from one launch; total = sum_b N * (prefix_b + N), known on the host."""
    batch, n, _ = ancestor.shape
    mask = torch.empty(total, dtype=torch.bool, device=ancestor.device)
    if batch:
        _custom_mask_kernel[(batch, n)](
            ancestor.contiguous(),
            prefix_lens,
            mask,
            batch,
            N=n,
            N_PAD=max(2, triton.next_power_of_2(n)),
            B_PAD=_batch_pad(batch),
            BLOCK=_MASK_BLOCK,
        )
    return mask


@triton.jit(do_not_specialize=["path_stride", "req_to_token_stride", "B"])
def _commit_kernel(
    path_ptr,  # [B, P] long, row stride path_stride: accepted local node indices, root first
    path_stride,
    lens_ptr,  # [B] long: committed nodes per request (<= P)
    slots_ptr,  # [B, N] long: the KV slot of every node
    pool_ptr,  # [B] long: req_to_token row of every request
    prefix_ptr,  # [B] int: committed length before this step
    req_to_token_ptr,  # [R, W] int32
    req_to_token_stride,
    out_ptr,  # [2 * B * N] long: kept slots [T] | freed slots [B * N - T] | kept nodes [T]
    B,
    N: tl.constexpr,
    N_PAD: tl.constexpr,
    P_PAD: tl.constexpr,
    B_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    others = tl.arange(0, B_PAD)
    lens = tl.load(lens_ptr + others, mask=others < B, other=0).to(tl.int64)
    kept_before = tl.sum(tl.where(others < b, lens, 0))
    length = tl.sum(tl.where(others == b, lens, 0))
    total = tl.sum(lens)

    depth = tl.arange(0, P_PAD)
    on_path = depth < length
    node = tl.load(path_ptr + b * path_stride + depth, mask=on_path, other=0)
    slot = tl.load(slots_ptr + b * N + node, mask=on_path, other=0)
    tl.store(out_ptr + kept_before + depth, slot, mask=on_path)
    tl.store(out_ptr + B * N + kept_before + depth, b * N + node, mask=on_path)
    pool = tl.load(pool_ptr + b).to(tl.int64)
    prefix = tl.load(prefix_ptr + b).to(tl.int64)
    tl.store(req_to_token_ptr + pool * req_to_token_stride + prefix + depth, slot.to(tl.int32), mask=on_path)

    every = tl.arange(0, N_PAD)
    kept = tl.max(((every[:, None] == node[None, :]) & on_path[None, :]).to(tl.int32), axis=1)
    freed = (every < N) & (kept == 0)
    rank = (tl.cumsum(freed.to(tl.int32), axis=0) - 1).to(tl.int64)
    freed_slot = tl.load(slots_ptr + b * N + every, mask=freed, other=0)
    tl.store(out_ptr + total + (b * N - kept_before) + rank, freed_slot, mask=freed)


def commit_path_fused(path, commit_lens, node_slots, req_to_token, req_pool_indices, prefix_lens, total: int):
    """commit_path's (kept slots [T], freed slots [B * N - T], kept nodes [T]) from one launch,
    writing req_to_token on the way; path's rows are strided (a view of the packed acceptance),
    its columns contiguous."""
    batch, n = node_slots.shape
    if path.stride(1) != 1:
        raise ValueError(f"path columns must be contiguous, got strides {path.stride()}")
    out = torch.empty(2 * batch * n, dtype=torch.long, device=node_slots.device)
    if batch:
        width = path.shape[1]
        _commit_kernel[(batch,)](
            path,
            path.stride(0),
            commit_lens,
            node_slots.contiguous(),
            req_pool_indices,
            prefix_lens,
            req_to_token,
            req_to_token.stride(0),
            out,
            batch,
            N=n,
            N_PAD=max(2, triton.next_power_of_2(n)),
            P_PAD=max(2, triton.next_power_of_2(width)),
            B_PAD=_batch_pad(batch),
        )
    return out[:total], out[total : batch * n], out[batch * n : batch * n + total]


def warm_up(verify_width: int, depth: int, max_batch: int, device) -> None:
    """Compile both kernels for every batch-size class up to max_batch (each B_PAD class is its
    own compiled variant), at start-up rather than in a decode step."""
    width = depth + 1
    for batch in sorted({_batch_pad(b) for b in range(1, max(1, max_batch) + 1)}):
        ancestor = torch.eye(verify_width, dtype=torch.bool, device=device).expand(batch, -1, -1)
        prefix = torch.zeros(batch, dtype=torch.long, device=device)
        verify_custom_mask_fused(ancestor, prefix, batch * verify_width * verify_width)
        path = torch.zeros(batch, width, dtype=torch.long, device=device)
        lens = torch.ones(batch, dtype=torch.long, device=device)
        slots = torch.arange(batch * verify_width, device=device).view(batch, verify_width)
        req_to_token = torch.zeros(batch, verify_width + width, dtype=torch.int32, device=device)
        commit_path_fused(path, lens, slots, req_to_token, torch.arange(batch, device=device), prefix, batch)

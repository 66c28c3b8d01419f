"""tree_attention_mask as one fused Triton kernel: one program per request.

Same mask as retrieve.py's torch ops (which define it): row i is True at i and
at every ancestor of i. The request's N x N block sits in registers; each of
the D steps climbs one level (cur = parents[cur], read back from the parents
row) and marks the column it reached.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k26_ddtree.core.tree import DDTree


@triton.jit
def _mask_kernel(
    parents_ptr,  # [B, N] long
    mask_ptr,  # [B, N, N] bool
    N: tl.constexpr,
    D: tl.constexpr,
    N_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    row = tl.arange(0, N_PAD)
    column = tl.arange(0, N_PAD)[None, :]
    in_tree = row < N
    ancestor = tl.load(parents_ptr + b * N + row, mask=in_tree, other=-1)
    mask = row[:, None] == column
    for _ in tl.static_range(D):
        mask = mask | (column == ancestor[:, None])
        ancestor = tl.load(parents_ptr + b * N + ancestor, mask=ancestor >= 0, other=-1)
    tl.store(mask_ptr + b * N * N + row[:, None] * N + column, mask, mask=in_tree[:, None] & (column < N))


def tree_attention_mask_fused(tree: DDTree) -> torch.Tensor:
    """tree_attention_mask's [B, N, N] bool from one kernel launch."""
    batch, n = tree.parents.shape
    mask = torch.empty(batch, n, n, dtype=torch.bool, device=tree.parents.device)
    if batch:
        _mask_kernel[(batch,)](
            tree.parents.contiguous(), mask, N=n, D=tree.depth_cap(), N_PAD=max(2, triton.next_power_of_2(n))
        )
    return mask

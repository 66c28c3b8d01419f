"""verify_greedy as one fused Triton kernel: one program walks one request's tree.

Same walk as verify.py's torch ops (which define it): from the root, descend to
the first child (lowest index) carrying the target's argmax at the current
node, at most D times; the target's token at the node where the walk stops is
the bonus. The torch walk is about ten small kernels per depth; here the
request's tokens, parents and target row sit in registers and each step is a
masked compare over them.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from k26_ddtree.core.tree import DDTree
from k26_ddtree.core.verify import Acceptance


@triton.jit
def _walk_kernel(
    tokens_ptr,  # [B, N] long
    parents_ptr,  # [B, N] long
    target_ptr,  # [B, N] long: the target's argmax after each node
    accept_ptr,  # [B] long
    path_ptr,  # [B, D + 1] long
    next_ptr,  # [B] long
    N: tl.constexpr,
    D: tl.constexpr,
    N_PAD: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    node_index = tl.arange(0, N_PAD)
    in_tree = node_index < N
    tokens = tl.load(tokens_ptr + b * N + node_index, mask=in_tree, other=-1)
    parents = tl.load(parents_ptr + b * N + node_index, mask=in_tree, other=-2)
    targets = tl.load(target_ptr + b * N + node_index, mask=in_tree, other=-1)

    node = tl.full([], 0, tl.int64)
    accepted = tl.full([], 0, tl.int64)
    walking = node == 0
    tl.store(path_ptr + b * (D + 1), node)
    for step in tl.static_range(D):
        wanted = tl.sum(tl.where(node_index == node, targets, 0))
        carries = (parents == node) & (tokens == wanted) & walking
        child = tl.min(tl.where(carries, node_index, N_PAD)).to(tl.int64)
        found = child < N_PAD
        tl.store(path_ptr + b * (D + 1) + step + 1, tl.where(found, child, -1))
        node = tl.where(found, child, node)
        accepted += found.to(tl.int64)
        walking = found
    tl.store(accept_ptr + b, accepted)
    tl.store(next_ptr + b, tl.sum(tl.where(node_index == node, targets, 0)))


def verify_greedy_fused(tree: DDTree, target_next: torch.Tensor) -> Acceptance:
    """verify_greedy's Acceptance from one kernel launch; inputs already checked."""
    batch, n = tree.tokens.shape
    depth = tree.depth_cap()
    device = tree.tokens.device
    accept_len = torch.empty(batch, dtype=torch.long, device=device)
    path = torch.empty(batch, depth + 1, dtype=torch.long, device=device)
    next_token = torch.empty(batch, dtype=torch.long, device=device)
    if batch:
        _walk_kernel[(batch,)](
            tree.tokens.contiguous(),
            tree.parents.contiguous(),
            target_next.contiguous(),
            accept_len,
            path,
            next_token,
            N=n,
            D=depth,
            N_PAD=max(2, triton.next_power_of_2(n)),
        )
    return Acceptance(accept_len=accept_len, path=path, next_token=next_token)

"""What SGLang's tree kernels and attention need from a DDTree, batched.

compile_ddtree_retrieve gives the EAGLE first-child / next-sibling encoding
read by `verify_tree_greedy` and `tree_speculative_sampling_target_only`;
tree_attention_mask gives the dense ancestor mask of the verify forward;
tree_positions gives the position ids. None of them syncs with the host when
the tree knows its depth cap (trees from build_ddtree do).
"""

from __future__ import annotations

from functools import lru_cache

import torch

from k26_ddtree.core.fused import fused_kernel
from k26_ddtree.core.tree import DDTree


def compile_ddtree_retrieve(tree: DDTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(retrieve_index, retrieve_next_token, retrieve_next_sibling), each [B, N] long.

    retrieve_index[b, i] = b * N + i (global, as SGLang indexes its flat buffers);
    retrieve_next_token[b, u] = local index of u's first child, or -1;
    retrieve_next_sibling[b, c] = local index of c's next sibling, or -1.
    Siblings run in descending node_logws, ties by node index; the root has no sibling.
    retrieve_index depends on the shape alone: it is one cached tensor per (B, N,
    device), shared between calls, so treat it as read-only.
    """
    batch, n = tree.parents.shape
    device = tree.parents.device
    retrieve_index = _global_index(batch, n, device)
    if not tree.best_first:
        return (retrieve_index, *_links_by_score(tree))

    # With siblings best-first by index, both links are "the first node after
    # index t whose parent is p": first child (p = u, t = u) and next sibling
    # (p = parents[c], t = c). One [2, B, N, N] compare answers both, and max
    # over bools returns the first True index.
    after, node, none = _link_constants(n, device)
    wanted = torch.stack([node.expand(batch, n), tree.parents])
    match = (tree.parents.view(1, batch, 1, n) == wanted.unsqueeze(3)) & after
    found, first = match.max(dim=3)
    links = torch.where(found, first, none)
    return retrieve_index, links[0], links[1]


# Unbounded on purpose (a handful of shapes per server): captured CUDA graphs read these
# tensors, and an evicted one would leave a graph reading freed memory.
@lru_cache(maxsize=None)
def _global_index(batch: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(batch * n, device=device).view(batch, n)


@lru_cache(maxsize=None)
def _link_constants(n: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """([N, N] bool: column index > row index, [N] long 0..N-1, 0-dim long -1), made
    once per size; a Python -1 in torch.where would cost a fill kernel per call."""
    node = torch.arange(n, device=device)
    return node.view(1, n) > node.view(n, 1), node, torch.tensor(-1, device=device)


def _links_by_score(tree: DDTree) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_token, next_sibling) of a hand-made tree, siblings sorted by node_logws."""
    batch, n = tree.parents.shape
    node = torch.arange(n, device=tree.parents.device)
    # place[b, i]: node i's rank in sibling order (descending score, ties by
    # index). Only relative order between siblings matters.
    by_score = torch.sort(0.0 - tree.node_logws.float(), dim=1, stable=True).indices
    place = torch.empty_like(by_score).scatter_(1, by_score, node.expand(batch, n))

    later_place = place.unsqueeze(1).expand(batch, n, n)
    siblings_after = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & (later_place > place.unsqueeze(2))
    first_after = torch.where(siblings_after, later_place, n).min(dim=2)
    next_sibling = torch.where(first_after.values < n, first_after.indices, -1)

    children = tree.parents.unsqueeze(1) == node.view(1, n, 1)
    first_child = torch.where(children, later_place, n).min(dim=2)
    next_token = torch.where(first_child.values < n, first_child.indices, -1)
    return next_token, next_sibling


def tree_attention_mask(tree: DDTree, *, fused: bool | None = None) -> torch.Tensor:
    """[B, N, N] bool: mask[b, i, j] is True iff node j is node i or one of its ancestors.

    fused: whether the fused Triton kernel (mask_kernel.py) runs instead of the torch
    ops; None (default) runs it for CUDA tensors (k26_ddtree.core.fused).
    """
    kernel = fused_kernel(fused, tree.parents, tree.verify_width, "core.mask_kernel", "tree_attention_mask_fused")
    if kernel is not None:
        return kernel(tree)
    batch, n = tree.parents.shape
    device = tree.parents.device
    mask = torch.eye(n, dtype=torch.bool, device=device).repeat(batch, 1, 1)
    self_index = torch.arange(n, device=device).expand(batch, n)
    ancestor = tree.parents
    for _ in range(tree.depth_cap()):
        # Nodes whose chain already ended point at themselves, already True.
        mask.scatter_(2, torch.where(ancestor >= 0, ancestor, self_index).unsqueeze(2), True)
        ancestor = torch.where(ancestor >= 0, tree.parents.gather(1, ancestor.clamp(min=0)), -1)
    return mask


def tree_positions(tree: DDTree, root_positions: torch.Tensor) -> torch.Tensor:
    """[B, N] long position ids: root_positions[b] (the root token's position) + depth."""
    return root_positions.long().unsqueeze(1) + tree.depths

"""What SGLang's tree kernels and attention need from a DDTree, batched.

compile_ddtree_retrieve gives the EAGLE first-child / next-sibling encoding
read by `verify_tree_greedy` and `tree_speculative_sampling_target_only`;
tree_attention_mask gives the dense ancestor mask of the verify forward;
tree_positions gives the position ids. None of them syncs with the host when
the tree knows its depth cap (trees from build_ddtree do).
"""

from __future__ import annotations

import torch

from k26_ddtree.tree import DDTree


def compile_ddtree_retrieve(tree: DDTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(retrieve_index, retrieve_next_token, retrieve_next_sibling), each [B, N] long.

    retrieve_index[b, i] = b * N + i (global, as SGLang indexes its flat buffers);
    retrieve_next_token[b, u] = local index of u's first child, or -1;
    retrieve_next_sibling[b, c] = local index of c's next sibling, or -1.
    Siblings run in descending node_logws, ties by node index; the root has no sibling.
    """
    batch, n = tree.parents.shape
    device = tree.parents.device
    retrieve_index = torch.arange(batch * n, device=device).view(batch, n)
    node = torch.arange(n, device=device)

    # place[b, i]: node i's rank in sibling order (descending score, ties by
    # index). Only relative order between siblings matters.
    if tree.best_first:
        place = node.expand(batch, n)
    else:
        by_score = torch.sort(0.0 - tree.node_logws.float(), dim=1, stable=True).indices
        place = torch.empty_like(by_score).scatter_(1, by_score, node.expand(batch, n))

    # Dense [B, N, N] comparisons instead of sorts: N is small and a handful of
    # elementwise kernels beats sorting inside a CUDA graph.
    later_place = place.unsqueeze(1).expand(batch, n, n)
    siblings_after = (tree.parents.unsqueeze(2) == tree.parents.unsqueeze(1)) & (later_place > place.unsqueeze(2))
    first_after = torch.where(siblings_after, later_place, n).min(dim=2)
    next_sibling = torch.where(first_after.values < n, first_after.indices, -1)

    children = tree.parents.unsqueeze(1) == node.view(1, n, 1)
    first_child = torch.where(children, later_place, n).min(dim=2)
    next_token = torch.where(first_child.values < n, first_child.indices, -1)
    return retrieve_index, next_token, next_sibling


def tree_attention_mask(tree: DDTree) -> torch.Tensor:
    """[B, N, N] bool: mask[b, i, j] is True iff node j is node i or one of its ancestors."""
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

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

    # Group nodes by parent (a stable sort keeps the within-group order), after
    # ordering by descending score (stable again: ties stay in index order).
    by_score = torch.sort(0.0 - tree.node_logws.float(), dim=1, stable=True).indices
    parent_by_score = tree.parents.gather(1, by_score)
    regroup = torch.sort(parent_by_score, dim=1, stable=True).indices
    order = by_score.gather(1, regroup)
    parent_sorted = parent_by_score.gather(1, regroup)

    # One extra column at the end absorbs the writes that have no target.
    dump = n
    same_parent_next = parent_sorted[:, 1:] == parent_sorted[:, :-1]
    next_sibling = torch.full((batch, n + 1), -1, dtype=torch.long, device=device)
    next_sibling.scatter_(1, order[:, :-1], torch.where(same_parent_next, order[:, 1:], -1))

    starts_group = torch.ones_like(parent_sorted, dtype=torch.bool)
    starts_group[:, 1:] = ~same_parent_next
    first_child_of = torch.where(starts_group & (parent_sorted >= 0), parent_sorted, dump)
    next_token = torch.full((batch, n + 1), -1, dtype=torch.long, device=device)
    next_token.scatter_(1, first_child_of, order)
    return retrieve_index, next_token[:, :n], next_sibling[:, :n]


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

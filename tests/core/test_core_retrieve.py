"""compile_ddtree_retrieve, tree_attention_mask and tree_positions against direct Python definitions."""

from __future__ import annotations

import pytest
import torch
from core_cases import draft_inputs, meta_tree, random_tree

from k26_ddtree.core.reference import children_of
from k26_ddtree.core.retrieve import compile_ddtree_retrieve, tree_attention_mask, tree_positions
from k26_ddtree.core.tree import DDTree, build_ddtree


def builder_tree(seed: int, batch: int, budget: int, spine: bool = False):
    gen = torch.Generator().manual_seed(seed)
    return build_ddtree(*draft_inputs(gen, batch, 7, 4, tie_step=0.5), budget, spine=spine)


def trees():
    yield builder_tree(1, 6, 1)
    yield builder_tree(2, 6, 2)
    yield builder_tree(3, 6, 16)
    yield builder_tree(4, 6, 64)
    yield builder_tree(5, 6, 30, spine=True)
    yield random_tree(torch.Generator().manual_seed(6), 5, 20)
    yield random_tree(torch.Generator().manual_seed(7), 3, 1)


@pytest.mark.parametrize("tree", list(trees()))
def test_retrieve_encoding_lists_every_child_best_first(tree):
    index, next_token, next_sibling = compile_ddtree_retrieve(tree)
    batch, n = tree.tokens.shape
    for t in (index, next_token, next_sibling):
        assert t.shape == (batch, n) and t.dtype == torch.long
    assert torch.equal(index, torch.arange(batch * n).view(batch, n))
    assert (next_sibling[:, 0] == -1).all()
    for b in range(batch):
        kids = children_of(tree, b)
        for u in range(n):
            chain = []
            c = int(next_token[b, u])
            while c != -1:
                chain.append(c)
                c = int(next_sibling[b, c])
            assert chain == kids[u], f"request {b} node {u}"


def test_builder_siblings_are_in_index_order():
    # The builder emits siblings best-first by index, so the encoding follows index order.
    tree = builder_tree(8, 4, 64)
    _, next_token, next_sibling = compile_ddtree_retrieve(tree)
    has_sibling = next_sibling >= 0
    assert (next_sibling[has_sibling] > torch.arange(65).expand(4, 65)[has_sibling]).all()
    has_child = next_token >= 0
    assert (next_token[has_child] > torch.arange(65).expand(4, 65)[has_child]).all()


def test_best_first_shortcut_agrees_with_the_sorting_path():
    tree = builder_tree(10, 8, 64, spine=True)
    hand = DDTree(tree.tokens, tree.parents, tree.depths, tree.node_logws)
    assert tree.best_first and not hand.best_first
    for fast, sorted_ in zip(compile_ddtree_retrieve(tree), compile_ddtree_retrieve(hand)):
        assert torch.equal(fast, sorted_)


def ancestors_mask(tree) -> torch.Tensor:
    batch, n = tree.parents.shape
    mask = torch.zeros(batch, n, n, dtype=torch.bool)
    for b in range(batch):
        parents = tree.parents[b].tolist()
        for i in range(n):
            j = i
            while j != -1:
                mask[b, i, j] = True
                j = parents[j]
    return mask


@pytest.mark.parametrize("tree", list(trees()))
def test_attention_mask_is_self_or_ancestor(tree):
    mask = tree_attention_mask(tree)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, ancestors_mask(tree))
    assert torch.equal(mask.sum(dim=2), tree.depths + 1)


def test_positions_add_depth_to_the_root_position():
    tree = builder_tree(9, 3, 16)
    root_positions = torch.tensor([10, 0, 1234], dtype=torch.int32)
    positions = tree_positions(tree, root_positions)
    assert positions.dtype == torch.long
    assert torch.equal(positions, root_positions.long()[:, None] + tree.depths)


def test_no_host_sync_for_builder_trees():
    tree = meta_tree()
    assert all(t.shape == (4, 33) for t in compile_ddtree_retrieve(tree))
    assert tree_attention_mask(tree).shape == (4, 33, 33)

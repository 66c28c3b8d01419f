"""build_ddtree against the heap reference and full enumeration; shape, order and input checks."""

from __future__ import annotations

import pytest
import torch
from core_cases import draft_inputs

from k26_ddtree.core.reference import enumerate_ddtree, heap_ddtree
from k26_ddtree.core.tree import DDTree, build_ddtree, max_budget

FIELDS = ("tokens", "parents", "depths", "node_logws")


def assert_same_tree(got: DDTree, want: DDTree) -> None:
    for field in FIELDS:
        a, b = getattr(got, field), getattr(want, field)
        assert a.shape == b.shape, field
        assert a.dtype == b.dtype, field
        assert torch.equal(a, b), f"{field} differs:\n{a}\n{b}"
    assert got.max_depth == want.max_depth


def budgets_for(depth: int, topk: int) -> list[int]:
    limit = max_budget(depth, topk)
    return sorted({b for b in (1, 2, 3, 7, 8, 16, 32, 64, limit - 1, limit) if 1 <= b <= min(limit, 600)})


SHAPES = [(1, 1), (1, 5), (2, 2), (2, 3), (3, 3), (4, 2), (3, 4), (5, 3), (7, 1), (7, 2), (7, 4), (7, 8)]


@pytest.mark.parametrize("depth,topk", SHAPES)
@pytest.mark.parametrize("tie_step", [0.0, 0.5])
@pytest.mark.parametrize("spine", [False, True])
def test_builder_matches_heap_reference(depth, topk, tie_step, spine):
    gen = torch.Generator().manual_seed(depth * 100 + topk + int(tie_step * 10) + spine)
    for budget in budgets_for(depth, topk):
        args = draft_inputs(gen, 3, depth, topk, tie_step=tie_step)
        assert_same_tree(build_ddtree(*args, budget, spine=spine), heap_ddtree(*args, budget, spine=spine))


@pytest.mark.parametrize("depth,topk", [(1, 4), (2, 3), (3, 3), (4, 2), (3, 4)])
@pytest.mark.parametrize("tie_step", [0.0, 0.25, 1.0])
@pytest.mark.parametrize("spine", [False, True])
def test_builder_matches_enumeration_up_to_every_prefix(depth, topk, tie_step, spine):
    gen = torch.Generator().manual_seed(7 + depth * 10 + topk)
    for budget in range(1, max_budget(depth, topk) + 1):
        args = draft_inputs(gen, 2, depth, topk, tie_step=tie_step)
        assert_same_tree(build_ddtree(*args, budget, spine=spine), enumerate_ddtree(*args, budget, spine=spine))


def test_builder_matches_heap_on_random_configurations():
    gen = torch.Generator().manual_seed(2024)
    for _ in range(60):
        depth = int(torch.randint(1, 9, (1,), generator=gen))
        topk = int(torch.randint(1, 11, (1,), generator=gen))
        batch = int(torch.randint(1, 6, (1,), generator=gen))
        budget = int(torch.randint(1, min(max_budget(depth, topk), 200) + 1, (1,), generator=gen))
        tie_step = [0.0, 0.125, 0.5, 2.0][int(torch.randint(0, 4, (1,), generator=gen))]
        spine = bool(torch.randint(0, 2, (1,), generator=gen))
        args = draft_inputs(gen, batch, depth, topk, vocab=50, tie_step=tie_step)
        assert_same_tree(build_ddtree(*args, budget, spine=spine), heap_ddtree(*args, budget, spine=spine))


@pytest.mark.parametrize("depth,topk", [(7, 4), (7, 8), (6, 10)])
@pytest.mark.parametrize("spine", [False, True])
def test_per_depth_survivors_match_the_heap_reference_on_server_sized_trees(depth, topk, spine):
    """Each depth keeps min(budget - d + 1, P * K) of its P * K children; a wrongly
    dropped child shows up here, where budget - d + 1 is far below P * K."""
    gen = torch.Generator().manual_seed(depth * 7 + topk + spine)
    for budget in (24, 48, 64, 96, 128):
        for tie_step in (0.0, 0.125, 0.5):
            args = draft_inputs(gen, 4, depth, topk, tie_step=tie_step)
            assert_same_tree(build_ddtree(*args, budget, spine=spine), heap_ddtree(*args, budget, spine=spine))


def test_all_ties_prefer_shallow_then_small_ranks():
    # Every log-prob 0: all prefixes tie, so the order is by depth, then rank path.
    roots = torch.tensor([5])
    tokens = torch.arange(6).view(1, 2, 3) + 10
    tree = build_ddtree(roots, tokens, torch.zeros(1, 2, 3), 6)
    assert tree.tokens.tolist() == [[5, 10, 11, 12, 13, 14, 15]]
    assert tree.parents.tolist() == [[-1, 0, 0, 0, 1, 1, 1]]
    assert tree.depths.tolist() == [[0, 1, 1, 1, 2, 2, 2]]
    spined = build_ddtree(roots, tokens, torch.zeros(1, 2, 3), 6, spine=True)
    assert spined.tokens.tolist() == [[5, 10, 13, 11, 12, 14, 15]]
    assert spined.parents.tolist() == [[-1, 0, 1, 0, 0, 1, 1]]


@pytest.mark.parametrize("budget", [1, 2, 5, 16, 64])
def test_tree_structure(budget):
    gen = torch.Generator().manual_seed(budget)
    roots, tokens, logprobs = draft_inputs(gen, 16, 7, 4, tie_step=0.5)
    tree = build_ddtree(roots, tokens, logprobs, budget)
    n = budget + 1
    for field in FIELDS:
        assert getattr(tree, field).shape == (16, n)
    assert tree.tokens.dtype == tree.parents.dtype == tree.depths.dtype == torch.long
    assert tree.node_logws.dtype == torch.float32
    assert tree.max_depth == 7 and tree.verify_width == n and tree.batch_size == 16
    assert torch.equal(tree.tokens[:, 0], roots)
    assert (tree.parents[:, 0] == -1).all() and (tree.depths[:, 0] == 0).all() and (tree.node_logws[:, 0] == 0).all()
    idx = torch.arange(1, n)
    assert (tree.parents[:, 1:] < idx).all() and (tree.parents[:, 1:] >= 0).all()
    parent_depth = tree.depths.gather(1, tree.parents[:, 1:])
    assert torch.equal(tree.depths[:, 1:], parent_depth + 1)
    # Best-first order: scores never rise along the node order.
    assert (tree.node_logws[:, 1:] <= tree.node_logws[:, :-1]).all()
    # Each node's token is the top-K token of its depth at its rank.
    for b in range(16):
        for i in range(1, n):
            assert int(tree.tokens[b, i]) in tokens[b, int(tree.depths[b, i]) - 1].tolist()


@pytest.mark.parametrize("depth,budget", [(7, 3), (7, 7), (7, 30), (3, 3), (3, 20)])
def test_spine_keeps_the_top1_chain(depth, budget):
    gen = torch.Generator().manual_seed(depth + budget)
    # A flat rank-0 distribution makes the plain best-first tree bushy, not deep.
    roots, tokens, _ = draft_inputs(gen, 4, depth, 4)
    logprobs = torch.tensor([-0.7, -0.8, -0.9, -1.0]).expand(4, depth, 4).clone()
    plain = build_ddtree(roots, tokens, logprobs, budget)
    tree = build_ddtree(roots, tokens, logprobs, budget, spine=True)
    chain = min(depth, budget)
    assert torch.equal(tree.tokens[:, 1 : chain + 1], tokens[:, :chain, 0])
    assert torch.equal(tree.depths[:, 1 : chain + 1], torch.arange(1, chain + 1).expand(4, chain))
    assert int(plain.depths.max()) < chain
    # The rest is the best-first fill of the other prefixes.
    assert (tree.node_logws[:, chain + 2 :] <= tree.node_logws[:, chain + 1 : -1]).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_float_dtypes_sum_in_float32(dtype):
    gen = torch.Generator().manual_seed(3)
    roots, tokens, logprobs = draft_inputs(gen, 4, 5, 3)
    logprobs = logprobs.to(dtype)
    got = build_ddtree(roots, tokens, logprobs, 40)
    assert_same_tree(got, heap_ddtree(roots, tokens, logprobs.float(), 40))


def test_empty_batch():
    tree = build_ddtree(
        torch.zeros(0, dtype=torch.long), torch.zeros(0, 3, 2, dtype=torch.long), torch.zeros(0, 3, 2), 5
    )
    assert tree.tokens.shape == (0, 6)


def good_inputs():
    gen = torch.Generator().manual_seed(0)
    return draft_inputs(gen, 2, 3, 4)


@pytest.mark.parametrize(
    "mutate,budget,message",
    [
        (lambda r, t, l: (r, t, l), 0, "budget 0 out of range: must be 1..84"),
        (lambda r, t, l: (r, t, l), 85, "budget 85 out of range"),
        (lambda r, t, l: (r, t, l), 2.0, "budget must be an int"),
        (lambda r, t, l: (r, t, l), True, "budget must be an int"),
        (lambda r, t, l: (r[:1], t, l), 4, "batch size mismatch"),
        (lambda r, t, l: (r[:, None], t, l), 4, "root_tokens must be \\[B\\]"),
        (lambda r, t, l: (r, t[0], l[0]), 4, "top_tokens must be \\[B, D, K\\]"),
        (lambda r, t, l: (r, t, l[:, :, :3]), 4, "does not match top_tokens shape"),
        (lambda r, t, l: (r, t.int(), l), 4, "must be torch.long"),
        (lambda r, t, l: (r.int(), t, l), 4, "must be torch.long"),
        (lambda r, t, l: (r, t, l.long()), 4, "must be a floating-point tensor"),
        (lambda r, t, l: (r, t, l.tolist()), 4, "top_logprobs must be a torch.Tensor"),
        (lambda r, t, l: (r, t[:, :0], l[:, :0]), 4, "need at least one draft position"),
        (lambda r, t, l: (r, t, torch.where(l == l.min(), float("nan"), l)), 4, "non-finite"),
        (lambda r, t, l: (r, t, torch.where(l == l.min(), float("-inf"), l)), 4, "non-finite"),
        (lambda r, t, l: (r, t, l + 50.0), 4, "positive values"),
        (lambda r, t, l: (r, t, l.flip(-1)), 4, "not descending along K"),
    ],
)
def test_bad_input_raises_value_error(mutate, budget, message):
    args = mutate(*good_inputs())
    with pytest.raises(ValueError, match=message):
        build_ddtree(*args, budget)


def test_budget_beyond_the_key_width_is_refused():
    roots = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="too large for the tie-breaking key"):
        build_ddtree(roots, torch.zeros(1, 8, 1024, dtype=torch.long), torch.zeros(1, 8, 1024), 300_000)


def test_validate_false_skips_only_value_checks():
    roots, tokens, logprobs = good_inputs()
    build_ddtree(roots, tokens, logprobs.flip(-1), 4, validate=False)
    with pytest.raises(ValueError, match="budget 85 out of range"):
        build_ddtree(roots, tokens, logprobs, 85, validate=False)


def test_hot_path_has_no_host_sync():
    """Meta tensors hold no data: any .item(), nonzero, boolean indexing or
    data-dependent shape fails on them, so passing here means the call can be
    captured in a CUDA graph at fixed shapes. The value checks do sync."""
    meta = dict(device="meta")
    roots = torch.zeros(8, dtype=torch.long, **meta)
    tokens = torch.zeros(8, 7, 8, dtype=torch.long, **meta)
    logprobs = torch.zeros(8, 7, 8, **meta)
    for spine in (False, True):
        tree = build_ddtree(roots, tokens, logprobs, 64, spine=spine, validate=False)
        assert tree.tokens.shape == (8, 65) and tree.tokens.device.type == "meta"
    with pytest.raises(NotImplementedError):
        build_ddtree(roots, tokens, logprobs, 64)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replay_matches_eager():
    from k26_ddtree.core.retrieve import compile_ddtree_retrieve

    gen = torch.Generator().manual_seed(11)
    args = [t.cuda() for t in draft_inputs(gen, 64, 7, 8, tie_step=0.25)]
    static = [t.clone() for t in args]

    def step():
        tree = build_ddtree(*static, 64, validate=False)
        return (tree.tokens, tree.parents, tree.depths, tree.node_logws, *compile_ddtree_retrieve(tree))

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.cuda.graph(graph):
            outputs = step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    fresh = [t.cuda() for t in draft_inputs(gen, 64, 7, 8, tie_step=0.25)]
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    # On CUDA build_ddtree runs the fused kernel; the CPU runs the torch ops.
    tree = build_ddtree(*[t.cpu() for t in fresh], 64)
    want = (tree.tokens, tree.parents, tree.depths, tree.node_logws, *compile_ddtree_retrieve(tree))
    for got, expected in zip(outputs, want):
        assert torch.equal(got.cpu(), expected)

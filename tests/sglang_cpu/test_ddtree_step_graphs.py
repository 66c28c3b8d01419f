"""step_graphs: the eager fallback equals the plain functions, when it is taken, and (on a
GPU only, through tests/gpu/graph_check.py) graph replay equals the eager step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from core_cases import draft_inputs, walk_target

from k26_ddtree.core.budget import max_budget
from k26_ddtree.core.retrieve import tree_attention_mask, tree_positions
from k26_ddtree.sglang.step_graphs import StepGraphs, StepTree
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import committed_tokens, verify_greedy

GRAPH_CHECK = Path(__file__).resolve().parents[1] / "gpu" / "graph_check.py"
DEPTH = 7
VOCAB = 40

CASES = [
    (batch, topk, budget, spine)
    for batch in (1, 3, 16)
    for topk in (1, 4, 8)
    for budget in (1, 7, 64)
    for spine in (False, True)
    if budget <= max_budget(DEPTH, topk)
]


def step_inputs(gen: torch.Generator, batch: int, topk: int):
    """(root, top_tokens, top_logprobs, prefix_lens); log-probs on a 0.5 grid, so scores tie."""
    root, tokens, logprobs = draft_inputs(gen, batch, DEPTH, topk, vocab=VOCAB, tie_step=0.5)
    return root, tokens, logprobs, torch.randint(0, 500, (batch,), generator=gen)


@pytest.mark.parametrize("batch,topk,budget,spine", CASES)
def test_eager_fallback_equals_the_plain_functions(batch, topk, budget, spine):
    gen = torch.Generator().manual_seed(batch * 1000 + topk * 100 + budget * 2 + spine)
    graphs = StepGraphs([1, 2, 4, 8, 16, 64])
    for _ in range(2):
        root, tokens, logprobs, prefix_lens = step_inputs(gen, batch, topk)
        step = graphs.draft(root, tokens, logprobs, prefix_lens, budget, spine)
        want = build_ddtree(root, tokens, logprobs, budget, spine=spine)
        assert step.graphs is None
        for name in ("tokens", "parents", "depths", "node_logws"):
            assert torch.equal(getattr(step.tree, name), getattr(want, name)), name
        assert step.tree.max_depth == DEPTH and step.tree.best_first
        assert torch.equal(step.ancestor, tree_attention_mask(want))
        assert torch.equal(step.positions, tree_positions(want, prefix_lens))

        target_next = walk_target(gen, want, vocab=VOCAB)
        acc = verify_greedy(want, target_next)
        packed = step.greedy_packed(target_next)
        assert packed.shape == (batch, 2 * (DEPTH + 1) + 1)
        want_packed = torch.cat([committed_tokens(want, acc), acc.path, acc.accept_len.unsqueeze(1)], dim=1)
        assert torch.equal(packed, want_packed)
    assert graphs.captured == 0, "nothing is captured off CUDA"


def test_walks_in_the_tests_accept_deep_paths():
    """The target of the equality test follows the tree often enough to test long paths."""
    gen = torch.Generator().manual_seed(0)
    root, tokens, logprobs, prefix_lens = step_inputs(gen, 16, 4)
    step = StepGraphs([]).draft(root, tokens, logprobs, prefix_lens, 64, False)
    assert int(step.greedy_packed(walk_target(gen, step.tree, vocab=VOCAB))[:, -1].max()) >= 3


def test_the_step_needs_no_host_sync():
    """On the meta device (no data) any host sync fails: the draft and verify pieces are
    capturable at fixed shapes."""
    meta = dict(device="meta")
    step = StepGraphs([8]).draft(
        torch.zeros(4, dtype=torch.long, **meta),
        torch.zeros(4, DEPTH, 8, dtype=torch.long, **meta),
        torch.zeros(4, DEPTH, 8, **meta),
        torch.zeros(4, dtype=torch.long, **meta),
        64,
        True,
    )
    assert step.ancestor.shape == (4, 65, 65) and step.positions.shape == (4, 65)
    packed = step.greedy_packed(torch.zeros(4, 65, dtype=torch.long, **meta))
    assert packed.shape == (4, 2 * (DEPTH + 1) + 1) and packed.device.type == "meta"


def test_start_up_without_graphs_runs_one_eager_step():
    """--disable-cuda-graph on a GPU: capture() compiles the kernels with one eager step
    (the meta device stands in for the GPU: it runs the same code without data)."""
    graphs = StepGraphs([])
    graphs.capture(DEPTH, 4, 16, True, "meta")
    graphs.capture(DEPTH, 4, 16, True, "cpu")
    assert graphs.captured == 0


def test_replayed_verify_refuses_a_target_of_the_wrong_shape():
    """The graph path copies into static buffers, where a wrong shape would broadcast silently."""
    from k26_ddtree.sglang.step_graphs import _ShapeGraphs

    shape = _ShapeGraphs.__new__(_ShapeGraphs)
    shape.batch = 3
    shape.target_next = torch.zeros(8, 17, dtype=torch.long)
    with pytest.raises(ValueError, match=r"target_next must be \[3, 17\] torch.long"):
        shape.verify(torch.zeros(1, 17, dtype=torch.long))


def test_hand_made_trees_get_an_eager_step():
    """StepTree.of_tree: the eager StepTree of a tree not from the builder."""
    gen = torch.Generator().manual_seed(5)
    root, tokens, logprobs, prefix_lens = step_inputs(gen, 3, 4)
    tree = build_ddtree(root, tokens, logprobs, 16)
    step = StepTree.of_tree(tree, prefix_lens)
    assert step.graphs is None
    assert torch.equal(step.ancestor, tree_attention_mask(tree))
    assert torch.equal(step.positions, prefix_lens.unsqueeze(1) + tree.depths)


def server_args(disable_cuda_graph=False, cuda_graph_bs=(1, 2, 4, 8, 16, 24, 32), max_running_requests=None):
    return SimpleNamespace(
        disable_cuda_graph=disable_cuda_graph,
        cuda_graph_bs=list(cuda_graph_bs),
        cuda_graph_max_bs=max(cuda_graph_bs),
        max_running_requests=max_running_requests,
    )


@pytest.mark.parametrize(
    "args,device,buckets",
    [
        (server_args(), "cuda:0", [1, 2, 4, 8, 16, 24, 32]),
        (server_args(cuda_graph_bs=(16, 1, 4)), torch.device("cuda", 1), [1, 4, 16]),
        (server_args(max_running_requests=10), "cuda", [1, 2, 4, 8, 16]),
        (server_args(max_running_requests=16), "cuda", [1, 2, 4, 8, 16]),
        (server_args(disable_cuda_graph=True), "cuda", []),
        (server_args(), "cpu", []),
    ],
)
def test_graphs_only_where_sglang_replays_its_own(args, device, buckets):
    """SGLang's own buckets, up to the first that holds the largest batch the server runs."""
    assert StepGraphs.for_server(args, device).buckets == buckets


def test_buckets_are_sorted_and_deduplicated():
    graphs = StepGraphs([16, 1, 4, 4])
    assert graphs.buckets == [1, 4, 16] and graphs.max_bs == 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_matches_eager_on_the_gpu():
    done = subprocess.run([sys.executable, str(GRAPH_CHECK)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr

"""step_graphs: the eager fallback equals the plain functions, when it is taken, and (on a
GPU only, through proving_ground/device/graph_check.py) graph replay equals the eager step."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from core_cases import draft_inputs, walk_target

from k26_ddtree.core.budget import max_budget
from k26_ddtree.core.retrieve import compile_ddtree_retrieve, tree_attention_mask, tree_positions
from k26_ddtree.core.tree import build_ddtree
from k26_ddtree.core.verify import committed_tokens, verify_greedy
from k26_ddtree.sglang.common.args import DDTreeConfig
from k26_ddtree.sglang.common.draft import DraftHead
from k26_ddtree.sglang.common.step_graphs import StepGraphs, StepTree, _BucketGraphs

GRAPH_CHECK = Path(__file__).resolve().parents[2] / "proving_ground" / "device" / "graph_check.py"
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


def config(budget: int, topk: int, spine: bool = False) -> DDTreeConfig:
    return DDTreeConfig(budget=budget, topk=topk, spine=spine, block_size=DEPTH + 1)


def logits_of(target_next: torch.Tensor) -> torch.Tensor:
    """[B * N, VOCAB] target logits whose argmax after each node is target_next [B, N]."""
    return torch.nn.functional.one_hot(target_next, VOCAB).float().view(-1, VOCAB)


def step_inputs(gen: torch.Generator, batch: int, topk: int):
    """(root, top_tokens, top_logprobs, prefix_lens); log-probs on a 0.5 grid, so scores tie."""
    root, tokens, logprobs = draft_inputs(gen, batch, DEPTH, topk, vocab=VOCAB, tie_step=0.5)
    return root, tokens, logprobs, torch.randint(0, 500, (batch,), generator=gen)


@pytest.mark.parametrize("batch,topk,budget,spine", CASES)
def test_eager_fallback_equals_the_plain_functions(batch, topk, budget, spine):
    gen = torch.Generator().manual_seed(batch * 1000 + topk * 100 + budget * 2 + spine)
    graphs = StepGraphs(config(budget, topk, spine), [1, 2, 4, 8, 16, 64])
    for _ in range(2):
        root, tokens, logprobs, prefix_lens = step_inputs(gen, batch, topk)
        step = graphs.draft(root, tokens, logprobs, prefix_lens)
        want = build_ddtree(root, tokens, logprobs, budget, spine=spine)
        assert step.graphs is None
        for name in ("tokens", "parents", "depths", "node_logws"):
            assert torch.equal(getattr(step.tree, name), getattr(want, name)), name
        assert step.tree.max_depth == DEPTH and step.tree.best_first
        assert torch.equal(step.ancestor, tree_attention_mask(want))
        assert torch.equal(step.positions, tree_positions(want, prefix_lens))
        for got, expected in zip(step.retrieve, compile_ddtree_retrieve(want)):
            assert torch.equal(got, expected)

        target_next = walk_target(gen, want, vocab=VOCAB)
        acc = verify_greedy(want, target_next)
        packed = step.accept_greedy(logits_of(target_next)).rows
        assert packed.shape == (batch, 2 * (DEPTH + 1) + 1)
        want_packed = torch.cat([committed_tokens(want, acc), acc.path, acc.accept_len.unsqueeze(1)], dim=1)
        assert torch.equal(packed, want_packed)
    assert graphs.captured == 0, "nothing is captured off CUDA"


def test_walks_in_the_tests_accept_deep_paths():
    """The target of the equality test follows the tree often enough to test long paths."""
    gen = torch.Generator().manual_seed(0)
    root, tokens, logprobs, prefix_lens = step_inputs(gen, 16, 4)
    step = StepGraphs(config(64, 4), []).draft(root, tokens, logprobs, prefix_lens)
    assert int(step.accept_greedy(logits_of(walk_target(gen, step.tree, vocab=VOCAB))).rows[:, -1].max()) >= 3


def test_the_step_needs_no_host_sync():
    """On the meta device (no data) any host sync fails: the draft and verify pieces are
    capturable at fixed shapes."""
    meta = dict(device="meta")
    step = StepGraphs(config(64, 8, spine=True), [8]).draft(
        torch.zeros(4, dtype=torch.long, **meta),
        torch.zeros(4, DEPTH, 8, dtype=torch.long, **meta),
        torch.zeros(4, DEPTH, 8, **meta),
        torch.zeros(4, dtype=torch.long, **meta),
    )
    assert step.ancestor.shape == (4, 65, 65) and step.positions.shape == (4, 65)
    packed = step.accept_greedy(torch.zeros(4 * 65, VOCAB, **meta)).rows
    assert packed.shape == (4, 2 * (DEPTH + 1) + 1) and packed.device.type == "meta"


def head_of(weight: torch.Tensor) -> DraftHead:
    """A one-rank DraftHead over the whole of `weight` [V, H]."""
    vocab = weight.shape[0]
    return DraftHead(weight=weight, num_org=vocab, org_start=0, num_org_padded=vocab, num_added=0, added_start=vocab)


def test_the_step_from_hidden_states_is_top_k_then_the_tree():
    """The one-rank draft piece (the whole of it in the draft graph) equals top-K log-probs
    of the lm_head logits followed by the tree step, and needs no host sync either."""
    gen = torch.Generator().manual_seed(9)
    weight = torch.randn(VOCAB, 12, generator=gen)
    head = head_of(weight)
    graphs = StepGraphs(config(16, 4, spine=True), [], head)
    assert graphs.owns_topk
    hidden = torch.randn(3, DEPTH, 12, generator=gen)
    root, prefix_lens = torch.tensor([5, 6, 7]), torch.tensor([10, 0, 3])
    step = graphs.draft_from_hidden(root, hidden, prefix_lens)
    top = torch.log_softmax(hidden @ weight.T, dim=2).topk(4, dim=2)
    want = build_ddtree(root, top.indices, top.values, 16, spine=True)
    for name in ("tokens", "parents", "depths"):
        assert torch.equal(getattr(step.tree, name), getattr(want, name)), name
    torch.testing.assert_close(step.tree.node_logws, want.node_logws, rtol=0, atol=1e-5)
    meta = head_of(torch.zeros(VOCAB, 12, device="meta"))
    on_meta = StepGraphs(config(16, 4), [8], meta).draft_from_hidden(
        torch.zeros(2, dtype=torch.long, device="meta"), torch.zeros(2, DEPTH, 12, device="meta"),
        torch.zeros(2, dtype=torch.long, device="meta"))
    assert on_meta.positions.shape == (2, 17) and on_meta.positions.device.type == "meta"


def test_start_up_without_graphs_runs_one_eager_step():
    """--disable-cuda-graph on a GPU: capture() compiles the kernels with one eager step
    (the meta device stands in for the GPU: it runs the same code without data)."""
    for device in ("meta", "cpu"):
        graphs = StepGraphs(config(16, 4, spine=True), [], device=device)
        graphs.capture()
        assert graphs.captured == 0
    with_head = StepGraphs(config(16, 4), [], head_of(torch.zeros(VOCAB, 12, device="meta")), device="meta")
    with_head.capture()
    assert with_head.captured == 0


def test_replayed_steps_refuse_inputs_of_the_wrong_shape():
    """The graph path copies into static buffers, where a wrong shape would broadcast silently."""
    bucket = _BucketGraphs.__new__(_BucketGraphs)
    bucket.rows = 3
    bucket.target_next = torch.zeros(8, 17, dtype=torch.long)
    with pytest.raises(ValueError, match=r"logits must be \[51, V\] for the step's 3 trees"):
        bucket.replay_accept(torch.zeros(17, VOCAB))
    bucket.inputs = {"top_tokens": torch.zeros(8, DEPTH, 4, dtype=torch.long)}
    bucket.root = torch.zeros(8, dtype=torch.long)
    with pytest.raises(ValueError, match=r"top_tokens must be \[B, 7, 4\] torch.int64"):
        bucket.replay_draft(torch.zeros(2, dtype=torch.long), torch.zeros(2), top_tokens=torch.zeros(2, DEPTH, 3))


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
    assert StepGraphs.server_batch_sizes(args, device) == buckets


def test_buckets_are_sorted_and_deduplicated():
    graphs = StepGraphs(config(8, 4), [16, 1, 4, 4])
    assert graphs.buckets == [1, 4, 16] and graphs.max_bs == 16


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_matches_eager_on_the_gpu():
    done = subprocess.run([sys.executable, str(GRAPH_CHECK)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr

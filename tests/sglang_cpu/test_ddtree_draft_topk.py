"""Draft top-K log-probs from a vocab-sharded lm_head, TP simulated with threads and a fake all_gather."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import torch

from k26_ddtree.sglang.common.draft import DraftHead


class FakeTpGroup:
    """all_gather_into_tensor across `world_size` threads, one per rank, like NCCL's."""

    def __init__(self, world_size: int):
        self.world_size = world_size
        self._barrier = threading.Barrier(world_size)
        self._slots: dict[int, torch.Tensor] = {}
        self._local = threading.local()

    def bind(self, rank: int) -> None:
        self._local.rank = rank

    def all_gather_into_tensor(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        self._slots[self._local.rank] = inp.clone()
        self._barrier.wait()
        out.copy_(torch.cat([self._slots[r] for r in range(self.world_size)], dim=0))
        self._barrier.wait()


def sharded_heads(patched_sglang, full_weight: torch.Tensor, org_vocab: int, tp: int, pad_to: int = 64):
    """The lm_head of every rank, laid out the way SGLang's VocabParallelEmbedding shards it."""
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding, pad_vocab_size

    vocab, hidden = full_weight.shape
    org_padded = pad_vocab_size(org_vocab, pad_to)
    vocab_padded = pad_vocab_size(org_padded + vocab - org_vocab, pad_to)
    heads = []
    for rank in range(tp):
        shard = VocabParallelEmbedding._get_indices(vocab_padded, org_padded, vocab, org_vocab, rank, tp)
        rows = torch.zeros(vocab_padded // tp, hidden, dtype=full_weight.dtype)
        rows[: shard.num_org_elements] = full_weight[shard.org_vocab_start_index : shard.org_vocab_end_index]
        added = slice(shard.num_org_elements_padded, shard.num_org_elements_padded + shard.num_added_elements)
        rows[added] = full_weight[shard.added_vocab_start_index : shard.added_vocab_end_index]
        heads.append(SimpleNamespace(weight=rows, shard_indices=shard))
    return heads


def run_ranks(heads, hidden: torch.Tensor, topk: int):
    group = FakeTpGroup(len(heads))
    results: dict[int, tuple] = {}
    errors = []

    def rank_main(rank: int) -> None:
        try:
            group.bind(rank)
            results[rank] = DraftHead.of(heads[rank], group).topk_logprobs(hidden, topk)
        except Exception as exc:  # surfaced below, a thread cannot fail the test itself
            errors.append(exc)

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(len(heads))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert len(results) == len(heads)
    return [results[r] for r in range(len(heads))]


@pytest.mark.parametrize("tp, org_vocab, added, topk", [(1, 1000, 0, 4), (2, 1000, 0, 8), (4, 997, 3, 4), (8, 301, 0, 16)])
def test_sharded_topk_equals_unsharded_log_softmax(patched_sglang, tp, org_vocab, added, topk):
    gen = torch.Generator().manual_seed(tp * 1000 + topk)
    vocab = org_vocab + added
    hidden_size = 32
    full_weight = torch.randn(vocab, hidden_size, generator=gen, dtype=torch.float64)
    hidden = torch.randn(300, hidden_size, generator=gen, dtype=torch.float64)
    heads = sharded_heads(patched_sglang, full_weight, org_vocab, tp)

    expected = torch.log_softmax((hidden @ full_weight.T).float(), dim=1).topk(topk, dim=1)
    for tokens, logprobs in run_ranks(heads, hidden, topk):
        assert tokens.dtype == torch.long and tokens.shape == (300, topk)
        assert torch.equal(tokens, expected.indices)
        torch.testing.assert_close(logprobs, expected.values, rtol=0, atol=1e-5)
        assert bool((logprobs[:, 1:] <= logprobs[:, :-1]).all())
        assert bool((logprobs <= 0).all())


def test_single_rank_without_group_matches_log_softmax(patched_sglang):
    gen = torch.Generator().manual_seed(7)
    full_weight = torch.randn(500, 16, generator=gen)
    hidden = torch.randn(600, 16, generator=gen)  # more rows than one chunk
    (head,) = sharded_heads(patched_sglang, full_weight, 500, 1)
    tokens, logprobs = DraftHead.of(head).topk_logprobs(hidden, 5)
    expected = torch.log_softmax(hidden @ full_weight.T, dim=1).topk(5, dim=1)
    assert torch.equal(tokens, expected.indices)
    torch.testing.assert_close(logprobs, expected.values, rtol=0, atol=1e-5)


@pytest.mark.parametrize("in_graph", [True, False])
def test_the_drafter_builds_the_tree_from_the_block_hidden_states(patched_sglang, in_graph):
    """DDTreeDrafter.draft, with the top-K inside the draft piece (one rank) or before it (TP)."""
    from k26_ddtree.sglang.common.args import DDTreeConfig
    from k26_ddtree.sglang.common.draft import DDTreeDrafter
    from k26_ddtree.sglang.common.step_graphs import StepGraphs

    gen = torch.Generator().manual_seed(3)
    full_weight = torch.randn(200, 16, generator=gen)
    (lm_head,) = sharded_heads(patched_sglang, full_weight, 200, 1)
    head = DraftHead.of(lm_head)
    config = DDTreeConfig(budget=10, topk=3, spine=True, block_size=5)
    drafter = DDTreeDrafter(config, head, StepGraphs(config, [], head if in_graph else None))
    draft_hidden = torch.randn(2, 5, 16, generator=gen)
    root = torch.tensor([11, 12])
    batch = SimpleNamespace(seq_lens=torch.tensor([3, 9]), reqs=[None, None])
    step = drafter.draft(root, draft_hidden, batch)
    tree = step.tree
    assert tree.tokens.shape == (2, 11)
    assert torch.equal(tree.tokens[:, 0], root)
    top1 = (draft_hidden[:, 1:] @ full_weight.T).argmax(dim=2)
    # spine: the top-1 chain is nodes 1..4 in depth order
    assert torch.equal(tree.tokens[:, 1:5], top1)
    assert torch.equal(tree.depths[:, 1:5], torch.arange(1, 5).expand(2, 4))
    assert torch.equal(step.positions, batch.seq_lens.unsqueeze(1) + tree.depths)


def test_a_top_k_hook_rewrites_before_the_tree(patched_sglang):
    """The test-only hook sees the requests and the merged top-K, and the tree is built from what it returns."""
    from k26_ddtree.sglang.common.args import DDTreeConfig
    from k26_ddtree.sglang.common.draft import DDTreeDrafter
    from k26_ddtree.sglang.common.step_graphs import StepGraphs

    gen = torch.Generator().manual_seed(4)
    (lm_head,) = sharded_heads(patched_sglang, torch.randn(50, 8, generator=gen), 50, 1)
    config = DDTreeConfig(budget=3, topk=2, spine=False, block_size=4)
    seen = []

    def hook(reqs, tokens, logprobs):
        seen.append((reqs, tokens.shape))
        return torch.full_like(tokens, 42), logprobs

    drafter = DDTreeDrafter(config, DraftHead.of(lm_head), StepGraphs(config, []), hook)
    step = drafter.draft(torch.tensor([1]), torch.randn(1, 4, 8, generator=gen),
                         SimpleNamespace(seq_lens=torch.tensor([5]), reqs=["r"]))
    assert seen == [(["r"], (1, 3, 2))]
    assert set(step.tree.tokens[0, 1:].tolist()) == {42}

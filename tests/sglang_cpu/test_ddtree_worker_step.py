"""The patched DFlashWorker's decode step with DDTree on, on CPU: the real
_prepare_for_speculative_decoding with fake runners around it, then the verify
and commit of the verify input it produced."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

VOCAB = 32
BLOCK = 4
MASK_ID = 3


class ScratchAllocator:
    """The draft block's scratch slots: allocated, then restored by the worker."""

    def __init__(self):
        self.next_slot = 500
        self.restored = False

    def backup_state(self):
        return self.next_slot

    def restore_state(self, state):
        self.next_slot = state
        self.restored = True

    def alloc(self, n):
        slots = torch.arange(self.next_slot, self.next_slot + n)
        self.next_slot += n
        return slots


class TritonAttnBackend:
    """Named like SGLang's, so DFlash's mask policy builds the custom mask."""


def torch_assign(req_pool_indices, req_to_token, start, end, out_cache_loc, bs):
    offset = 0
    for b in range(bs):
        length = int(end[b] - start[b])
        req_to_token[int(req_pool_indices[b]), int(start[b]) : int(end[b])] = out_cache_loc[offset : offset + length]
        offset += length


def lm_head(patched_sglang):
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

    shard = VocabParallelEmbedding._get_indices(VOCAB, VOCAB, VOCAB, VOCAB, 0, 1)
    return SimpleNamespace(weight=torch.eye(VOCAB) * 4.0, shard_indices=shard)


def draft_logits(rows):
    """Hidden states whose lm_head logits rank `rows[i]` first, second, ... at draft row i."""
    hidden = torch.zeros(len(rows), VOCAB)
    for i, ranked in enumerate(rows):
        for r, token in enumerate(ranked):
            hidden[i, token] = 3.0 - r
    return hidden


def server_args(config, trace=None, max_mb=1024):
    """What DDTreeDrafter.for_worker reads of a validated ServerArgs on the CPU."""
    return SimpleNamespace(
        max_running_requests=4, disable_cuda_graph=False, cuda_graph_bs=[1, 2], cuda_graph_max_bs=2,
        model_path="/models/target", speculative_draft_model_path="/models/draft",
        speculative_ddtree_budget=config.budget, speculative_ddtree_topk=config.topk,
        speculative_ddtree_spine=config.spine, speculative_dflash_block_size=config.block_size,
        speculative_ddtree_trace=trace, speculative_ddtree_trace_max_mb=max_mb,
        speculative_ddtree_budget_schedule=None,
    )


def one_bucket(config):
    from k26_ddtree.sglang.common.args import DDTreeSchedule, ScheduleBucket

    return DDTreeSchedule((ScheduleBucket(1, config, config.block_size),))


def make_worker(patched_sglang, monkeypatch, draft_hidden, config=None, head_in_graph=True, trace=None,
                schedule=None):
    """head_in_graph: the drafters as the worker builds them (DDTreeDrafters.for_worker, tracing to
    `trace` when given); False: a drafter whose graphs start from the top-K, as under TP. `schedule`
    replaces the one bucket of `config`."""
    from k26_ddtree.sglang.common.args import DDTreeConfig
    from k26_ddtree.sglang.common.draft import DDTreeDrafter, DDTreeDrafters, DraftHead
    from k26_ddtree.sglang.common.step_graphs import StepGraphs
    from sglang.srt.speculative import dflash_worker
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

    monkeypatch.setattr(dflash_worker, "assign_req_to_token_pool_func", torch_assign)
    monkeypatch.setattr(dflash_worker, "get_tp_group", lambda: SimpleNamespace(world_size=1))
    worker = object.__new__(dflash_worker.DFlashWorker)
    embed = torch.nn.Embedding(VOCAB, VOCAB)
    target_model = SimpleNamespace(get_input_embeddings=lambda: embed, lm_head=lm_head(patched_sglang))
    worker.target_worker = SimpleNamespace(model_runner=SimpleNamespace(model=target_model))
    worker.model_runner = SimpleNamespace(attn_backend=TritonAttnBackend(), device="cpu")
    forwards = []

    def draft_forward(forward_batch):
        forwards.append(forward_batch)
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=draft_hidden))

    worker.draft_model_runner = SimpleNamespace(
        token_to_kv_pool_allocator=ScratchAllocator(),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.zeros(4, 64, dtype=torch.int32)),
        token_to_kv_pool=None,
        attn_backend=None,
        forward=draft_forward,
    )
    worker.device = "cpu"
    worker.page_size = 1
    worker.tp_rank = 0
    worker.block_size = BLOCK
    config = config or DDTreeConfig(budget=5, topk=2, spine=False, block_size=BLOCK)
    worker.ddtree = schedule or one_bucket(config)
    tp_group = SimpleNamespace(world_size=1)
    if head_in_graph:
        worker._ddtree_drafters = DDTreeDrafters.for_worker(
            worker.ddtree, server_args(config, trace), target_model.lm_head, tp_group, "cpu", tp_rank=0
        )
    else:
        head = DraftHead.of(target_model.lm_head, tp_group)
        drafter = DDTreeDrafter(config, head, StepGraphs(config, []))
        worker._ddtree_drafters = DDTreeDrafters(worker.ddtree, [drafter], None)
    worker._mask_token_id = MASK_ID
    worker._warned_sampling_fallback = False
    worker._block_pos_offsets = torch.arange(BLOCK)
    for name in ("ids", "positions", "tokens", "end"):
        setattr(worker, f"_draft_block_{name}_buf", None)
    worker._draft_seq_lens_cpu_buf = None
    worker._draft_block_spec_info = DFlashVerifyInput(
        draft_token=torch.empty(0, dtype=torch.long), positions=torch.empty(0, dtype=torch.long),
        draft_token_num=BLOCK, custom_mask=None, capture_hidden_mode=CaptureHiddenMode.NULL,
    )
    worker._append_target_hidden_to_draft_kv = lambda batch, draft_input: None
    return worker, forwards


class Allocator:
    def __init__(self):
        self.next_slot = 100
        self.freed = []

    def alloc(self, n):
        slots = torch.arange(self.next_slot, self.next_slot + n)
        self.next_slot += n
        return slots

    def free(self, slots):
        self.freed.extend(slots.tolist())


class Req:
    """finish_at: the request finishes once it holds this many output ids."""

    def __init__(self, output_ids, rid="req", finish_at=None):
        self.rid = rid
        self.output_ids = list(output_ids)
        self.finish_at = finish_at
        self.grammar = None
        self.spec_verify_ct = self.spec_accepted_drafts = self.kv_committed_len = self.kv_allocated_len = 0
        self.histogram = []

    def check_finished(self):
        pass

    def finished(self):
        return self.finish_at is not None and len(self.output_ids) >= self.finish_at

    def update_spec_acceptance_histogram(self, n):
        self.histogram.append(n)


@pytest.mark.parametrize("head_in_graph", [True, False], ids=["one-rank-draft-piece", "top-k-first"])
def test_decode_step_drafts_a_tree_verifies_it_and_commits_the_path(patched_sglang, monkeypatch, head_in_graph):
    from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    # One request; draft positions 1..3 rank (10, 11), (12, 13), (14, 15) first and second.
    draft_hidden = torch.cat([torch.zeros(1, VOCAB), draft_logits([[10, 11], [12, 13], [14, 15]])])
    worker, forwards = make_worker(patched_sglang, monkeypatch, draft_hidden, head_in_graph=head_in_graph)
    allocator = Allocator()
    seq_lens = torch.tensor([6])
    batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        has_grammar=False,
        sampling_info=None,
        batch_size=lambda: 1,
        reqs=[Req([1, 2, 9])],
        device=torch.device("cpu"),
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=6,
        req_pool_indices=torch.tensor([1]),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.full((4, 64), -1, dtype=torch.int32)),
        tree_cache=SimpleNamespace(is_chunk_cache=lambda: True, token_to_kv_pool_allocator=allocator),
        token_to_kv_pool_allocator=allocator,
        spec_info=None,
        input_ids=None,
        out_cache_loc=None,
        return_hidden_states=True,
    )
    draft_input = SimpleNamespace(verified_id=torch.tensor([9]), draft_seq_lens=torch.tensor([6], dtype=torch.int32))

    worker._prepare_for_speculative_decoding(batch, draft_input)

    (draft_batch,) = forwards
    assert draft_batch.forward_mode == ForwardMode.TARGET_VERIFY
    assert draft_batch.input_ids.tolist() == [9, MASK_ID, MASK_ID, MASK_ID]
    assert worker.draft_model_runner.token_to_kv_pool_allocator.restored
    verify_input = batch.spec_info
    assert isinstance(verify_input, DDTreeVerifyInput)
    assert batch.forward_mode == ForwardMode.TARGET_VERIFY
    assert verify_input.draft_token_num == 6
    tree = verify_input.tree
    assert tree.tokens[0, 0] == 9 and tree.tokens[0, 1:4].tolist() == [10, 12, 14], "rank-0 chain first"
    assert set(tree.tokens[0, 4:].tolist()) <= {11, 13, 15}
    assert verify_input.positions.tolist() == (6 + tree.depths[0]).tolist()
    assert verify_input.custom_mask.numel() == 6 * (6 + 6)
    assert batch.input_ids.tolist() == tree.tokens[0].tolist()

    # Target: accepts 10, then prefers the second-ranked 13 at depth 2 if the tree has it.
    n = 6
    node_of = {tuple(): 0}
    for i in range(1, n):
        parent_path = next(p for p, j in node_of.items() if j == int(tree.parents[0, i]))
        node_of[parent_path + (int(tree.tokens[0, i]),)] = i
    target_next = torch.full((n,), 31)
    target_next[0] = 10
    target_next[node_of[(10,)]] = 13
    if (10, 13) in node_of:
        target_next[node_of[(10, 13)]] = 30
        expected = [10, 13, 30]
    else:
        expected = [10, 13]
    logits = torch.nn.functional.one_hot(target_next, VOCAB).float()
    hidden = torch.arange(n, dtype=torch.float32).view(n, 1)
    new_verified, commit_lens, next_hidden, accepted = verify_input.verify(
        batch=batch, logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden), page_size=1
    )
    assert batch.reqs[0].output_ids == [1, 2, 9] + expected
    assert new_verified.tolist() == [expected[-1]]
    assert commit_lens.tolist() == [len(expected)]
    path_nodes = [0] + [node_of[tuple(expected[:k])] for k in range(1, len(expected))]
    assert next_hidden.view(-1).tolist() == [float(i) for i in path_nodes]
    assert batch.req_to_token_pool.req_to_token[1, 6 : 6 + len(expected)].tolist() == [100 + i for i in path_nodes]
    assert sorted(allocator.freed) == sorted(100 + i for i in range(n) if i not in path_nodes)


def test_budget_one_tree_is_smaller_than_the_draft_block(patched_sglang, monkeypatch):
    """Budget 1: the draft still runs its 4-slot block, the target verifies 2 nodes (root + the
    top-1 draft), and the step commits the draft plus the target's bonus."""
    from k26_ddtree.sglang.common.args import DDTreeConfig
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    draft_hidden = torch.cat([torch.zeros(1, VOCAB), draft_logits([[10, 11], [12, 13], [14, 15]])])
    config = DDTreeConfig(budget=1, topk=1, spine=False, block_size=BLOCK)
    worker, forwards = make_worker(patched_sglang, monkeypatch, draft_hidden, config)
    allocator = Allocator()
    seq_lens = torch.tensor([6])
    batch = SimpleNamespace(
        forward_mode=ForwardMode.DECODE, has_grammar=False, sampling_info=None, batch_size=lambda: 1,
        reqs=[Req([1, 2, 9])], device=torch.device("cpu"), seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=6, req_pool_indices=torch.tensor([1]),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.full((4, 64), -1, dtype=torch.int32)),
        tree_cache=SimpleNamespace(is_chunk_cache=lambda: True, token_to_kv_pool_allocator=allocator),
        token_to_kv_pool_allocator=allocator, spec_info=None, input_ids=None, out_cache_loc=None,
        return_hidden_states=True,
    )
    draft_input = SimpleNamespace(verified_id=torch.tensor([9]), draft_seq_lens=torch.tensor([6], dtype=torch.int32))

    worker._prepare_for_speculative_decoding(batch, draft_input)

    (draft_batch,) = forwards
    assert draft_batch.out_cache_loc.numel() == BLOCK, "the draft block keeps its full size"
    verify_input = batch.spec_info
    assert verify_input.draft_token_num == 2
    assert verify_input.tree.tokens.tolist() == [[9, 10]]
    assert verify_input.custom_mask.numel() == 2 * (6 + 2)

    logits = torch.nn.functional.one_hot(torch.tensor([10, 20]), VOCAB).float()
    hidden = torch.tensor([[5.0], [7.0]])
    new_verified, commit_lens, next_hidden, accepted = verify_input.verify(
        batch=batch, logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden), page_size=1
    )
    assert batch.reqs[0].output_ids == [1, 2, 9, 10, 20]
    assert (new_verified.tolist(), commit_lens.tolist(), accepted) == ([20], [2], [1])
    assert next_hidden.view(-1).tolist() == [5.0, 7.0]
    assert batch.req_to_token_pool.req_to_token[1, 6:8].tolist() == [100, 101]
    assert allocator.freed == []
    assert batch.seq_lens.tolist() == [8]


def decode_batch(reqs, seq_lens, allocator):
    """A decode ScheduleBatch of these requests, as the worker step reads and updates it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    seq_lens = torch.tensor(seq_lens)
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE, has_grammar=False, sampling_info=None, batch_size=lambda: len(reqs),
        reqs=reqs, device=torch.device("cpu"), seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()), req_pool_indices=torch.arange(1, len(reqs) + 1),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.full((4, 64), -1, dtype=torch.int32)),
        tree_cache=SimpleNamespace(is_chunk_cache=lambda: True, token_to_kv_pool_allocator=allocator),
        token_to_kv_pool_allocator=allocator, spec_info=None, input_ids=None, out_cache_loc=None,
        return_hidden_states=True,
    )


def decode_step(worker, batch, verified_id):
    """One whole decode step: draft and prepare, then a target that accepts each tree's first
    depth-1 node and offers a token outside the tree after it. Returns (tree tokens, new roots)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    batch.forward_mode = ForwardMode.DECODE  # as the scheduler sets it for every decode step
    worker._prepare_for_speculative_decoding(
        batch, SimpleNamespace(verified_id=verified_id, draft_seq_lens=batch.seq_lens.to(torch.int32))
    )
    verify_input = batch.spec_info
    tokens = verify_input.tree.tokens.clone()
    bs, n = tokens.shape
    target_next = torch.empty(bs, n, dtype=torch.long)
    for b in range(bs):
        target_next[b] = next(t for t in range(VOCAB) if t not in tokens[b].tolist())
        target_next[b, 0] = tokens[b, 1]
    logits = torch.nn.functional.one_hot(target_next.view(-1), VOCAB).float()
    new_verified, _, _, _ = verify_input.verify(
        batch=batch,
        logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=torch.zeros(bs * n, 1)),
        page_size=1,
    )
    return tokens, new_verified


def distinct_draft_hidden(batch_size):
    """Draft hidden states whose lm_head logits have no ties, so every top-8 is one answer."""
    gen = torch.Generator().manual_seed(7)
    return torch.stack([torch.randperm(VOCAB, generator=gen).float() / 8 for _ in range(batch_size * BLOCK)])


def test_traced_steps_record_the_drafters_top8_and_what_each_request_committed(patched_sglang, monkeypatch,
                                                                               tmp_path):
    from k26_ddtree.sglang.common import trace

    draft_hidden = distinct_draft_hidden(2)
    path = tmp_path / "steps.trace"
    worker, _ = make_worker(patched_sglang, monkeypatch, draft_hidden, trace=str(path))
    (drafter,) = worker._ddtree_drafters.drafters
    assert not drafter.graphs.owns_topk and drafter.trace_topk == trace.TOPK, "the top-8 is drafted eagerly"
    untraced, _ = make_worker(patched_sglang, monkeypatch, draft_hidden)
    # req-b finishes after one token of its second step: its record holds that token alone.
    reqs = [Req([1, 2, 9], rid="req-a"), Req([4, 5, 7], rid="req-b", finish_at=6)]
    batch = decode_batch(reqs, [6, 8], Allocator())
    plain_trees, _ = decode_step(untraced, decode_batch([Req([1, 2, 9]), Req([4, 5, 7])], [6, 8], Allocator()),
                                 torch.tensor([9, 7]))

    roots, trees, appended = [], [], []
    verified_id = torch.tensor([9, 7])
    for _ in range(2):
        before = [len(req.output_ids) for req in reqs]
        roots.append(verified_id.tolist())
        tokens, verified_id = decode_step(worker, batch, verified_id)
        trees.append(tokens)
        appended.append([req.output_ids[start:] for req, start in zip(reqs, before)])
    assert torch.equal(trees[0], plain_trees), "tracing drafts the same trees"
    assert appended[1][1] == appended[0][1][:1], "req-b stopped at its finish"
    drafter.trace.close()

    meta, steps = trace.read(path)
    assert (meta["depth"], meta["topk"], meta["served"]) == (BLOCK - 1, 8, "1:5/2")
    keys = [trace.request_key("req-a"), trace.request_key("req-b")]
    assert steps.request.tolist() == keys * 2
    assert steps.step.tolist() == [0, 0, 1, 1]
    assert steps.root.tolist() == roots[0] + roots[1]
    width = BLOCK
    assert steps.committed.tolist() == [row + [-1] * (width - len(row)) for step in appended for row in step]
    logits = draft_hidden.view(2, BLOCK, VOCAB)[:, 1:] @ (torch.eye(VOCAB) * 4.0)
    want = torch.log_softmax(logits, dim=-1).topk(trace.TOPK, dim=-1)
    for s in range(2):
        assert torch.equal(steps.tokens[2 * s:2 * s + 2], want.indices)
        torch.testing.assert_close(steps.logprobs[2 * s:2 * s + 2], want.values)


def test_untraced_worker_keeps_the_graph_path_and_writes_nothing(patched_sglang, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    worker, _ = make_worker(patched_sglang, monkeypatch, distinct_draft_hidden(1))
    (drafter,) = worker._ddtree_drafters.drafters
    assert drafter.graphs.owns_topk, "one rank, no trace: lm_head and top-K inside the draft graph"
    assert (drafter.trace_topk, drafter.trace) == (None, None)
    batch = decode_batch([Req([1, 2, 9])], [6], Allocator())
    worker._prepare_for_speculative_decoding(
        batch, SimpleNamespace(verified_id=torch.tensor([9]), draft_seq_lens=torch.tensor([6], dtype=torch.int32))
    )
    assert batch.spec_info.step.trace is None
    assert list(tmp_path.iterdir()) == []


def test_other_tp_ranks_draft_the_same_top8_but_write_nothing(patched_sglang, monkeypatch, tmp_path):
    """Every rank must draft the same top-K width (the all_gather); only rank 0 has the file."""
    from k26_ddtree.sglang.common.args import DDTreeConfig
    from k26_ddtree.sglang.common.draft import DDTreeDrafters

    config = DDTreeConfig(budget=5, topk=2, spine=False, block_size=BLOCK)
    (drafter,) = DDTreeDrafters.for_worker(one_bucket(config), server_args(config, str(tmp_path / "t.trace")),
                                           lm_head(patched_sglang), SimpleNamespace(world_size=1), "cpu",
                                           tp_rank=1).drafters
    assert (drafter.trace_topk, drafter.trace) == (8, None)
    step = drafter.draft(torch.tensor([9]), distinct_draft_hidden(1).view(1, BLOCK, VOCAB),
                         SimpleNamespace(seq_lens=torch.tensor([6]), reqs=[Req([9])]))
    assert step.trace is None
    assert list(tmp_path.iterdir()) == []


def test_schedule_serves_each_batch_size_from_its_bucket(patched_sglang, monkeypatch):
    """Schedule 1:5/2,2:0: one request drafts a budget-5 tree; two requests take DFlash's own chain
    (its argmax block, its verify input of block-size tokens, none of DDTree's work); back to one,
    the tree again. The chain bucket's verify is DFlash's, run as the chain's own test would."""
    from k26_ddtree.sglang.common.args import DDTreeConfig, DDTreeSchedule, ScheduleBucket
    from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput
    from sglang.srt.speculative import dflash_info

    monkeypatch.setattr(dflash_info, "assign_req_to_token_pool_func", torch_assign)  # a Triton kernel in SGLang
    config = DDTreeConfig(budget=5, topk=2, spine=False, block_size=BLOCK)
    schedule = DDTreeSchedule((ScheduleBucket(1, config, BLOCK), ScheduleBucket(2, None, BLOCK)))
    draft_hidden = distinct_draft_hidden(2)
    worker, forwards = make_worker(patched_sglang, monkeypatch, draft_hidden, config, schedule=schedule)
    assert [d is None for d in worker._ddtree_drafters.drafters] == [False, True]
    allocator = Allocator()

    two = decode_batch([Req([1, 9], rid="a"), Req([1, 8], rid="b")], [6, 7], allocator)
    worker._prepare_for_speculative_decoding(
        two, SimpleNamespace(verified_id=torch.tensor([9, 8]), draft_seq_lens=two.seq_lens.to(torch.int32))
    )
    chain = two.spec_info
    assert not isinstance(chain, DDTreeVerifyInput) and chain.draft_token_num == BLOCK
    expected = torch.argmax(draft_hidden.view(2, BLOCK, VOCAB)[:, 1:] @ (torch.eye(VOCAB) * 4.0), dim=-1)
    assert chain.draft_token.view(2, BLOCK)[:, 0].tolist() == [9, 8]
    assert torch.equal(chain.draft_token.view(2, BLOCK)[:, 1:], expected), "DFlash's argmax chain"
    assert chain.custom_mask is not None, "the triton backend's graphs read a mask for both kinds"

    worker.draft_model_runner.forward = lambda fb: SimpleNamespace(
        logits_output=SimpleNamespace(hidden_states=draft_hidden[:BLOCK])
    )
    one = decode_batch([Req([1, 9], rid="a")], [6], allocator)
    tokens, _ = decode_step(worker, one, torch.tensor([9]))
    assert isinstance(one.spec_info, DDTreeVerifyInput) and tokens.shape == (1, 6)

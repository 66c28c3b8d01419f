"""The patched DFlashWorkerV2's decode step with DDTree on, on CPU: the real
forward_batch_generation (its draft block prepare and draft forward, then DDTree's draft, verify
input, SGLang's prepare_for_verify, accept and commit) with fake runners around it, two steps
chained the way the overlap scheduler chains them (next lengths and bonus from the result)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

VOCAB = 32
BLOCK = 4
CONTEXT = 40  # the context length: req_to_token rows hold 64
MASK_ID = 3


def lm_head():
    from sglang.srt.layers.vocab_parallel_embedding import VocabParallelEmbedding

    return SimpleNamespace(weight=torch.eye(VOCAB) * 4.0,
                           shard_indices=VocabParallelEmbedding._get_indices(VOCAB, VOCAB, VOCAB, VOCAB, 0, 1))


def draft_rows(ranked_per_position, batch):
    """Draft hidden states [B * BLOCK, VOCAB] whose lm_head logits rank ranked_per_position[d] at
    block position d + 1 of every request (position 0, the root's, is unused)."""
    hidden = torch.zeros(batch, BLOCK, VOCAB)
    for d, ranked in enumerate(ranked_per_position):
        for r, token in enumerate(ranked):
            hidden[:, d + 1, token] = 3.0 - r
    return hidden.view(-1, VOCAB)


def server_args(budget_schedule=None, budget=5, topk=2, trace=None):
    return SimpleNamespace(
        speculative_algorithm="DFLASH", speculative_ddtree_budget=None if budget_schedule else budget,
        speculative_ddtree_topk=None if budget_schedule else topk, speculative_ddtree_spine=False,
        speculative_ddtree_budget_schedule=budget_schedule, speculative_dflash_block_size=BLOCK,
        speculative_ddtree_trace=trace, speculative_ddtree_trace_max_mb=1024, max_running_requests=4,
        model_path="/models/target", speculative_draft_model_path="/models/draft",
        speculative_num_draft_tokens=None,
    )


class Target:
    """The target runner: its forward records the verify batch and answers with logits whose argmax
    after a node is target(tokens of the path to it), and hidden states naming each row."""

    def __init__(self, target):
        self.target = target
        self.forwards = []

    def forward(self, forward_batch, verify):
        self.forwards.append(forward_batch)
        tokens = verify.draft_token.view(-1, verify.draft_token_num)
        parents = verify.step.tree.parents
        rows = []
        for b in range(tokens.shape[0]):
            for i in range(tokens.shape[1]):
                path, node = [], i
                while node >= 0 and i < parents.shape[1]:
                    path.insert(0, int(tokens[b, node]))
                    node = int(parents[b, node])
                rows.append(self.target(b, path) if i < parents.shape[1] else 0)
        logits = torch.nn.functional.one_hot(torch.tensor(rows), VOCAB).float()
        hidden = torch.arange(len(rows), dtype=torch.float32).view(-1, 1) + 1000
        return SimpleNamespace(logits_output=SimpleNamespace(next_token_logits=logits, hidden_states=hidden),
                               can_run_cuda_graph=False)


def make_worker(patched_sglang, monkeypatch, args, draft_hidden, target):
    from k26_ddtree.sglang.v0_5_17 import worker as ddtree_worker
    from sglang.srt.speculative import dflash_info, dflash_worker_v2

    monkeypatch.setattr(ddtree_worker, "get_tp_group", lambda: SimpleNamespace(world_size=1))
    monkeypatch.setattr(ddtree_worker, "mambaish_config", lambda model_config: None)

    def torch_cache_locs(req_pool_indices, req_to_token, start_offset, end_offset, batch_size, draft_token_num,
                         device):
        cols = start_offset.unsqueeze(1) + torch.arange(draft_token_num)
        return req_to_token[req_pool_indices.unsqueeze(1), cols].reshape(-1).to(torch.int64)

    monkeypatch.setattr(dflash_worker_v2, "assign_extend_cache_locs_func", torch_cache_locs)
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda self, stream: None)  # no streams on the CPU
    verifies = []

    def init_new(batch, model_runner, **kwargs):
        verifies.append(batch.spec_info)
        return SimpleNamespace(input_ids=batch.input_ids, out_cache_loc=batch.out_cache_loc,
                               seq_lens_cpu=batch.seq_lens_cpu, spec_info=batch.spec_info)

    monkeypatch.setattr(dflash_info.ForwardBatch, "init_new", staticmethod(init_new))
    worker = object.__new__(dflash_worker_v2.DFlashWorkerV2)
    req_to_token = (torch.arange(4).unsqueeze(1) * 1000 + torch.arange(64)).to(torch.int32)
    embed = torch.nn.Embedding(VOCAB, 8)
    target_runner = SimpleNamespace(
        model=SimpleNamespace(get_input_embeddings=lambda: embed, lm_head=lm_head()),
        model_config=SimpleNamespace(vocab_size=VOCAB, context_len=CONTEXT), req_to_token_pool=SimpleNamespace(req_to_token=req_to_token),
        decode_cuda_graph_runner=None, attn_backend=SimpleNamespace(init_forward_metadata=lambda fb: None),
        device="cpu",
    )
    target_model = Target(target)
    worker._target_worker = SimpleNamespace(
        model_runner=target_runner,
        forward_batch_generation=lambda batch, forward_batch, is_verify, skip_attn_backend_init: target_model.forward(
            forward_batch, verifies[-1]),
    )
    worker.model_runner = target_runner
    worker.server_args = args
    worker.ps = SimpleNamespace(tp_rank=0)
    worker.device = "cpu"
    worker.page_size = 1
    worker.block_size = BLOCK
    worker.draft_window_size = None
    worker.use_compact_draft_cache = False
    worker._need_mamba_verify_commit = False
    worker._warned_sampling_fallback = False
    worker._use_triton_prepare_block = False
    worker._mask_token_id = MASK_ID
    worker._block_pos_offsets = torch.arange(BLOCK)
    for name in ("ids", "positions", "tokens", "end"):
        setattr(worker, f"_draft_block_{name}_buf", None)
    worker._draft_verify_out_cache_loc_buf = None
    worker._draft_seq_lens_cpu_buf = None
    from sglang.srt.speculative.draft_worker_common import make_draft_block_spec_info

    worker._draft_block_spec_info = make_draft_block_spec_info(draft_token_num=BLOCK, device="cpu")
    drafts = []

    def draft_forward(forward_batch):
        drafts.append(forward_batch)
        return SimpleNamespace(logits_output=SimpleNamespace(hidden_states=draft_hidden), can_run_graph=False)

    worker.draft_model_runner = SimpleNamespace(forward=draft_forward, attn_backend=None)
    appended = []
    worker._append_target_hidden_to_draft_kv_by_loc = lambda **kw: appended.append(kw)
    worker._draft_sampler = None
    worker._ddtree = ddtree_worker.DDTreeV2.for_worker(worker, None)
    return worker, SimpleNamespace(drafts=drafts, verifies=verifies, appended=appended, target=target_model,
                                   req_to_token=req_to_token)


class Req:
    def __init__(self, rid):
        self.rid = rid
        self.sampling_params = SimpleNamespace(top_k=1)


def decode_batch(seq_lens, bonus, reqs):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative.draft_worker_common import make_draft_input_v2

    seq_lens = torch.tensor(seq_lens)
    draft_input = make_draft_input_v2(bonus_tokens=torch.tensor(bonus), new_seq_lens=seq_lens)
    return SimpleNamespace(
        forward_mode=ForwardMode.DECODE, is_extend_in_batch=False, return_logprob=False, has_grammar=False,
        sampling_info=None, reqs=reqs, seq_lens=seq_lens, seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()), req_pool_indices=torch.arange(1, len(reqs) + 1), spec_info=draft_input,
        input_ids=None, out_cache_loc=None, device=torch.device("cpu"),
    )


def test_two_overlap_steps_verify_the_tree_and_commit_on_the_device(patched_sglang, monkeypatch):
    from k26_ddtree.sglang.v0_5_17.ddtree_info import DDTreeVerifyInputV2
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    # Draft ranks (10, 11), (12, 13), (14, 15) at depths 1..3. The target takes 10, then prefers
    # the second-ranked 13, then offers 30.
    def target(b, path):
        return {1: 10, 2: 13, 3: 30}.get(len(path), 31) if path[1:2] in ([], [10]) and path[2:3] in ([], [13]) else 31

    worker, seen = make_worker(patched_sglang, monkeypatch, server_args(), draft_rows([[10, 11], [12, 13], [14, 15]], 2),
                               target)
    batch = decode_batch([6, 9], [9, 7], [Req("a"), Req("b")])
    result = worker.forward_batch_generation(batch)

    (draft,) = seen.drafts
    assert draft.forward_mode == ForwardMode.TARGET_VERIFY and draft.input_ids.tolist() == [9, 3, 3, 3, 7, 3, 3, 3]
    verify = seen.verifies[0]
    assert isinstance(verify, DDTreeVerifyInputV2) and verify.draft_token_num == 6
    tree = verify.step.tree
    assert tree.tokens[:, :4].tolist() == [[9, 10, 12, 14], [7, 10, 12, 14]], "the rank-0 chain first"
    (forward,) = seen.target.forwards
    assert forward.out_cache_loc.tolist() == [1006 + i for i in range(6)] + [2009 + i for i in range(6)]
    assert forward.seq_lens_cpu.tolist() == [12, 15], "the host bound: prefix + the verify"
    assert batch.seq_lens_cpu.tolist() == [6, 9], "restored after prepare"

    node_13 = [int(i) for i in (tree.tokens[0] == 13).nonzero().view(-1)]
    expected_path = [0, 1] + node_13
    commit_len = len(expected_path)
    assert result.accept_lens.tolist() == [commit_len] * 2
    assert result.speculative_num_draft_tokens == 4, "the stride: the depth cap + 1"
    tokens = result.next_token_ids.view(2, 4)
    assert tokens[0, :commit_len].tolist() == ([10, 13, 30] if node_13 else [10, 13])
    assert result.new_seq_lens.tolist() == [6 + commit_len, 9 + commit_len]
    assert result.next_draft_input.bonus_tokens.tolist() == [tokens[0, commit_len - 1]] * 2
    assert seen.req_to_token[1, 6:6 + commit_len].tolist() == [1006 + i for i in expected_path]
    assert sorted(seen.req_to_token[1, 6:12].tolist()) == [1006 + i for i in range(6)], "no slot leaves the row"
    (append,) = seen.appended
    assert append["cache_loc_2d"][0, :commit_len].tolist() == [1006 + i for i in expected_path]
    assert append["positions"].view(2, 4)[1].tolist() == [9, 10, 11, 12]
    assert append["target_hidden"].view(2, 4)[0, :commit_len].tolist() == [1000 + i for i in expected_path]
    assert append["commit_lens"].tolist() == [commit_len] * 2

    # The scheduler's next step: lengths and bonus from this result, nothing read back in between.
    again = decode_batch(result.new_seq_lens.tolist(), result.next_draft_input.bonus_tokens.tolist(),
                         batch.reqs)
    row = seen.req_to_token[1].clone()
    worker.forward_batch_generation(again)
    second = seen.target.forwards[1].out_cache_loc.view(2, 6)[0].tolist()
    assert second == row[6 + commit_len:12 + commit_len].tolist(), "the next tree takes the slots past the path"


def test_without_host_lengths_the_verify_plans_with_the_schedulers_reservation(patched_sglang, monkeypatch):
    """Where the attention backend does not ask for them (triton), the scheduler hands the step no
    host lengths: the mask and the backend's plan take the reservation as their bound, and the
    step commits what it commits with the exact lengths."""
    def target(b, path):
        return 10 if len(path) == 1 else 31

    committed = []
    for host_lengths in (True, False):
        worker, seen = make_worker(patched_sglang, monkeypatch, server_args(),
                                   draft_rows([[10, 11], [12, 13], [14, 15]], 2), target)
        batch = decode_batch([6, 9], [9, 7], [Req("a"), Req("b")])
        if not host_lengths:
            batch.seq_lens_cpu = None
            batch.spec_info.reserved_seq_lens_cpu = torch.tensor([6 + 12, CONTEXT + 12])
            batch.spec_info.reserved_seq_lens_sum = 6 + 12 + CONTEXT + 12
        result = worker.forward_batch_generation(batch)
        verify, (forward,) = seen.verifies[0], seen.target.forwards
        width = verify.draft_token_num
        if host_lengths:
            assert verify.custom_mask.numel() == width * (6 + width + 9 + width)
        else:
            assert forward.seq_lens_cpu.tolist() == [6 + 12, CONTEXT + 12], "the reservation, as DFlash plans"
            assert verify.custom_mask.numel() == width * (6 + 12 + width + CONTEXT + width), \
                "the prefix bound stops at the context length"
            assert batch.seq_lens_cpu is None, "restored after prepare"
        ancestor = verify.step.ancestor
        for b, (start, prefix) in enumerate([(0, 6), (width * (6 + width), 9)]):
            rows = verify.custom_mask[start:start + width * (prefix + width)].view(width, prefix + width)
            assert rows[:, :prefix].all() and torch.equal(rows[:, prefix:], ancestor[b]), "laid out by the true prefix"
        committed.append((result.next_token_ids.tolist(), result.accept_lens.tolist(), result.new_seq_lens.tolist()))
    assert committed[0] == committed[1]


def test_a_step_without_host_lengths_or_reservation_is_refused(patched_sglang):
    from k26_ddtree.sglang.v0_5_17.worker import host_length_bounds

    batch = SimpleNamespace(seq_lens_cpu=None)
    with pytest.raises(RuntimeError, match="host bound"):
        host_length_bounds(batch, SimpleNamespace(reserved_seq_lens_cpu=None), 9, CONTEXT)
    exact = SimpleNamespace(seq_lens_cpu=torch.tensor([5, 7]))
    prefix, verify = host_length_bounds(exact, SimpleNamespace(reserved_seq_lens_cpu=None), 9, CONTEXT)
    assert prefix.tolist() == [5, 7] and verify.tolist() == [14, 16]


def test_each_bucket_verifies_at_its_own_width_and_a_chain_bucket_at_the_block(patched_sglang, monkeypatch):
    args = server_args(budget_schedule="1:8/2,2:0")
    worker, seen = make_worker(patched_sglang, monkeypatch, args, draft_rows([[10, 11], [12, 13], [14, 15]], 2),
                               lambda b, path: 31)
    worker.forward_batch_generation(decode_batch([6, 9], [9, 7], [Req("a"), Req("b")]))
    chain = seen.verifies[0]
    assert chain.draft_token_num == chain.num_tokens_per_req == BLOCK, "the chain bucket verifies the block"
    assert chain.draft_token.view(2, BLOCK).tolist() == [[9, 10, 12, 14], [7, 10, 12, 14]], "the drafter's argmax"
    assert seen.target.forwards[0].seq_lens_cpu.tolist() == [6 + BLOCK, 9 + BLOCK]

    worker._draft_block_ids_buf = None
    one = decode_batch([6], [9], [Req("a")])
    worker.draft_model_runner.forward = lambda fb: SimpleNamespace(
        logits_output=SimpleNamespace(hidden_states=draft_rows([[10, 11], [12, 13], [14, 15]], 1)),
        can_run_graph=False)
    result = worker.forward_batch_generation(one)
    tree = seen.verifies[1]
    assert tree.draft_token_num == 9 and tree.step.tree.tokens.shape == (1, 9), "budget 8 + the root, unpadded"
    assert seen.target.forwards[1].seq_lens_cpu.tolist() == [6 + 9], "the host bound of the step's own width"
    assert result.accept_lens.tolist() == [1] and result.next_token_ids.tolist()[:1] == [31]


def test_traced_steps_record_the_committed_tokens_per_request(patched_sglang, monkeypatch, tmp_path):
    from k26_ddtree.sglang.common import trace

    path = tmp_path / "steps.trace"
    worker, _ = make_worker(patched_sglang, monkeypatch, server_args(trace=str(path)),
                            draft_rows([[10, 11], [12, 13], [14, 15]], 2),
                            lambda b, p: {1: 10, 2: 12}.get(len(p), 20 + b))
    batch = decode_batch([6, 9], [9, 7], [Req("a"), Req("b")])
    first = worker.forward_batch_generation(batch)
    worker.forward_batch_generation(decode_batch(first.new_seq_lens.tolist(),
                                                 first.next_draft_input.bonus_tokens.tolist(), batch.reqs))
    worker._ddtree.drafters.drafters[0].trace.close()
    meta, steps = trace.read(path)
    assert meta["depth"] == BLOCK - 1
    assert steps.request.tolist() == [trace.request_key("a"), trace.request_key("b")] * 2
    assert steps.step.tolist() == [0, 0, 1, 1]
    assert steps.committed[:2].tolist() == [[10, 12, 20, -1], [10, 12, 21, -1]]


def test_hybrid_targets_and_oversized_topk_are_rejected_at_start_up(patched_sglang, monkeypatch):
    from k26_ddtree.sglang.common.args import DDTreeArgsError
    from k26_ddtree.sglang.v0_5_17 import worker as ddtree_worker

    runner = SimpleNamespace(model_config=SimpleNamespace(vocab_size=4))
    monkeypatch.setattr(ddtree_worker, "mambaish_config", lambda model_config: None)
    with pytest.raises(DDTreeArgsError, match="exceeds the vocabulary"):
        ddtree_worker.check_target(runner, topk=8)
    monkeypatch.setattr(ddtree_worker, "mambaish_config", lambda model_config: object())
    with pytest.raises(DDTreeArgsError, match="hybrid Mamba"):
        ddtree_worker.check_target(runner, topk=1)


def test_step_graph_sizes_follow_sglangs_decode_graphs():
    from k26_ddtree.sglang.v0_5_17.worker import graph_batch_sizes

    assert graph_batch_sizes([1, 2, 4, 8, 16, 32, 64], 12) == [1, 2, 4, 8, 16]
    assert graph_batch_sizes(None, 48) == []

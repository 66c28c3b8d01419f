"""The DDTree verify step on small CPU tensors: custom mask, acceptance, path commit, and one
whole prepare -> verify step against a fake batch with SGLang's field names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sampling_law import sampling_info

from k26_ddtree.core.retrieve import compile_ddtree_retrieve, tree_attention_mask
from k26_ddtree.core.tree import DDTree
from k26_ddtree.core.verify import verify_greedy
from k26_ddtree.sglang.common.step_graphs import StepTree

HERE = Path(__file__).resolve().parent

# Two requests, N = 6 nodes each (budget 5, depth cap 3).
#   request 0:  0 -> 1 -> 3 -> 5       request 1:  0 -> 1 -> 2 -> 3
#                 \-> 2 -> 4                         \-> 4     \-> 5
PARENTS = [[-1, 0, 0, 1, 2, 3], [-1, 0, 1, 2, 0, 1]]
TOKENS = [[50, 11, 12, 13, 14, 15], [60, 21, 22, 23, 24, 25]]


def hand_tree(parents=PARENTS, tokens=TOKENS, max_depth=3) -> DDTree:
    depths = []
    for row in parents:
        d = []
        for p in row:
            d.append(0 if p < 0 else d[p] + 1)
        depths.append(d)
    n = len(parents[0])
    return DDTree(
        tokens=torch.tensor(tokens),
        parents=torch.tensor(parents),
        depths=torch.tensor(depths),
        node_logws=-torch.arange(n, dtype=torch.float32).expand(len(parents), n).clone(),
        max_depth=max_depth,
    )


def test_custom_mask_is_prefix_then_ancestor_mask_per_request(patched_sglang):
    from k26_ddtree.sglang.common.verify_utils import verify_custom_mask

    tree = hand_tree()
    ancestor = tree_attention_mask(tree)
    prefix = torch.tensor([3, 0])
    flat = verify_custom_mask(ancestor, prefix, prefix.clone())
    n = 6
    assert flat.dtype == torch.bool and flat.numel() == n * (3 + n) + n * (0 + n)
    start = 0
    for b, p in enumerate(prefix.tolist()):
        rows = flat[start : start + n * (p + n)].view(n, p + n)
        assert bool(rows[:, :p].all())
        assert torch.equal(rows[:, p:], ancestor[b])
        start += n * (p + n)


def test_chain_tree_mask_equals_dflash_causal_mask(patched_sglang):
    from k26_ddtree.sglang.common.verify_utils import verify_custom_mask

    n = 5
    chain = hand_tree(parents=[list(range(-1, n - 1))] * 3, tokens=[list(range(n))] * 3, max_depth=n - 1)
    prefix = torch.tensor([4, 1, 7])
    flat = verify_custom_mask(tree_attention_mask(chain), prefix, prefix.clone())
    # DFlash's layout (dflash_info.prepare_for_verify): k <= prefix + q, row-major per request.
    expected = []
    for p in prefix.tolist():
        q = torch.arange(n).unsqueeze(1)
        k = torch.arange(p + n).unsqueeze(0)
        expected.append((k <= p + q).flatten())
    assert torch.equal(flat, torch.cat(expected))


def commit(path, commit_lens, node_slots, prefix=None, pool=None):
    """commit_path on a fresh req_to_token; (PathCommit, req_to_token)."""
    from k26_ddtree.sglang.common.verify_utils import commit_path

    batch = node_slots.shape[0]
    req_to_token = torch.full((batch + 1, 16), -1, dtype=torch.int32)
    prefix = torch.zeros(batch, dtype=torch.long) if prefix is None else torch.tensor(prefix)
    pool = torch.arange(batch) if pool is None else torch.tensor(pool)
    lens = torch.tensor(commit_lens)
    result = commit_path(torch.tensor(path), lens, node_slots, req_to_token, pool, prefix, int(lens.sum()))
    return result, req_to_token


def test_commit_path_keeps_accepted_slots_in_depth_order_and_frees_the_rest(patched_sglang):
    node_slots = torch.tensor([[100, 101, 102, 103, 104, 105], [200, 201, 202, 203, 204, 205]])
    # request 0 accepted 0 -> 2 -> 4 (non-first sibling, then its child), committing root + 2 drafts;
    # request 1 accepted 0 -> 1 -> 5 but finished after its first token: commit_len 1.
    result, req_to_token = commit([[0, 2, 4, -1], [0, 1, 5, -1]], [3, 1], node_slots, prefix=[4, 2], pool=[2, 0])
    assert result.kept_slots.tolist() == [100, 102, 104, 200]
    assert result.freed_slots.tolist() == [101, 103, 105, 201, 202, 203, 204, 205], "node order"
    assert result.kept_nodes.tolist() == [0, 2, 4, 6]
    assert req_to_token[2, 4:7].tolist() == [100, 102, 104] and req_to_token[0, 2:3].tolist() == [200]
    assert int((req_to_token >= 0).sum()) == 4


def test_commit_path_keeps_depth_order_when_node_indices_are_not_increasing(patched_sglang):
    result, req_to_token = commit([[0, 4, 2, -1]], [3], torch.arange(6).view(1, 6) + 10)
    assert result.kept_slots.tolist() == [10, 14, 12]
    assert result.freed_slots.tolist() == [11, 13, 15]
    assert result.kept_nodes.tolist() == [0, 4, 2]
    assert req_to_token[0, :3].tolist() == [10, 14, 12]


def test_commit_path_full_depth(patched_sglang):
    result, _ = commit([[0, 1, 3, 5]], [4], torch.arange(6).view(1, 6) + 10)
    assert result.kept_slots.tolist() == [10, 11, 13, 15]
    assert result.freed_slots.tolist() == [12, 14]


def test_verify_kernels_match_the_torch_ops_in_the_interpreter(patched_sglang):
    """The fused custom-mask and commit kernels (verify_kernels.py, and 0.5.17's
    commit_kernel.py) against the torch ops, in Triton's CPU interpreter; on a GPU
    proving_ground/device/graph_check.py runs them for real."""
    pytest.importorskip("triton")
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    done = subprocess.run(
        [sys.executable, str(HERE / "verify_kernel_cases.py")], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cases agree" in done.stdout


def fake_tree_sampling_kernel(
    *, predicts, accept_index, accept_token_num, candidates, retrive_index, retrive_next_token,
    retrive_next_sibling, uniform_samples, uniform_samples_for_final_sampling, target_probs, draft_probs,
    threshold_single, threshold_acc, deterministic,
):
    """sgl_kernel 0.4.2's tree_speculative_sampling_target_only, step for step: the depth is
    accept_index.size(1) - 1, a rejected child's target mass goes into draft_probs at its
    parent's row, and the bonus is drawn from relu(target - draft) at the last accepted node."""
    assert float(draft_probs.abs().sum()) == 0.0, "draft_probs must be zeroed before every call"
    assert (threshold_single, threshold_acc) == (1.0, 1.0)
    bs, n = candidates.shape
    for b in range(bs):
        cur, accepted = 0, 0
        accept_index[b, 0] = int(retrive_index[b, 0])
        for level in range(1, accept_index.shape[1]):
            coin = float(uniform_samples[b, cur])  # one coin per visited node, reused across its children
            child, mass, moved = int(retrive_next_token[b, cur]), 0.0, False
            while child != -1:
                token = int(candidates[b, child])
                p = float(target_probs[b, cur, token])
                mass += p
                if coin <= mass / threshold_acc or p >= threshold_single:
                    predicts[int(retrive_index[b, cur])] = token
                    cur, moved = child, True
                    accepted += 1
                    accept_index[b, accepted] = int(retrive_index[b, child])
                    break
                draft_probs[b, cur, token] = p
                child = int(retrive_next_sibling[b, child])
            if not moved:
                break
        accept_token_num[b] = accepted
        residual = (target_probs[b, cur] - draft_probs[b, cur]).clamp(min=0)
        cdf = (residual / residual.sum()).cumsum(0)
        predicts[int(retrive_index[b, cur])] = int(torch.searchsorted(cdf, uniform_samples_for_final_sampling[b]))


def one_hot_targets(tree: DDTree, target_next: torch.Tensor, vocab: int) -> torch.Tensor:
    return torch.nn.functional.one_hot(target_next, vocab).float()


@pytest.mark.parametrize("seed", range(5))
def test_kernel_path_decodes_like_the_greedy_walk_on_one_hot_targets(patched_sglang, seed):
    from k26_ddtree.sglang.common.verify_utils import kernel_sampling

    tree = hand_tree()
    gen = torch.Generator().manual_seed(seed)
    # target argmax: mostly the tree's children, sometimes not
    target_next = torch.randint(10, 30, (2, 6), generator=gen)
    target_next[0, 0], target_next[0, 2] = 12, 14
    target_next[1, 0] = 21
    acc_kernel = kernel_sampling(
        tree, compile_ddtree_retrieve(tree), one_hot_targets(tree, target_next, 64), fake_tree_sampling_kernel
    )
    acc_walk = verify_greedy(tree, target_next)
    assert torch.equal(acc_kernel.accept_len, acc_walk.accept_len)
    assert torch.equal(acc_kernel.path, acc_walk.path)
    assert torch.equal(acc_kernel.next_token, acc_walk.next_token)


def test_kernel_path_accepts_non_first_siblings_with_their_law(patched_sglang):
    from k26_ddtree.sglang.common.verify_utils import kernel_sampling

    draws = 3000
    tree = hand_tree(parents=[[-1, 0, 0, 0]] * draws, tokens=[[9, 1, 2, 3]] * draws, max_depth=1)
    probs = torch.zeros(draws, 4, 8)
    probs[:, 0, 1], probs[:, 0, 2], probs[:, 0, 5] = 0.2, 0.5, 0.3
    probs[:, 1:, 7] = 1.0
    torch.manual_seed(0)
    acc = kernel_sampling(tree, compile_ddtree_retrieve(tree), probs, fake_tree_sampling_kernel)
    accepted = tree.tokens.gather(1, acc.path[:, 1:2].clamp(min=0)).squeeze(1)
    first = torch.where(acc.accept_len > 0, accepted, acc.next_token)
    freq = torch.bincount(first, minlength=8).float() / draws
    assert freq[[1, 2, 5]].tolist() == pytest.approx([0.2, 0.5, 0.3], abs=0.04)


def test_target_probs_applies_temperature_top_k_and_top_p(patched_sglang):
    from k26_ddtree.sglang.common.verify_utils import target_probs

    logits = torch.log(torch.tensor([[0.4, 0.3, 0.2, 0.1]])).repeat(4, 1)  # 2 requests x 2 nodes
    info = SimpleNamespace(
        temperatures=torch.tensor([[1.0], [1.0]]),
        top_ks=torch.tensor([2, 4]),
        top_ps=torch.tensor([1.0, 0.65]),
        need_top_k_sampling=True,
        need_top_p_sampling=True,
    )
    probs = target_probs(logits, info, 2)
    assert probs.shape == (2, 2, 4)
    torch.testing.assert_close(probs[0, 0], torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7)
    torch.testing.assert_close(probs[1, 1], torch.tensor([0.4, 0.3, 0.0, 0.0]) / 0.7)


class FakeAllocator:
    def __init__(self, first_slot: int):
        self.next_slot = first_slot
        self.freed: list[int] = []

    def alloc(self, n: int) -> torch.Tensor:
        slots = torch.arange(self.next_slot, self.next_slot + n)
        self.next_slot += n
        return slots

    def available_size(self) -> int:
        return 1 << 20

    def free(self, slots: torch.Tensor) -> None:
        self.freed.extend(slots.tolist())


class FakeReq:
    def __init__(self, output_ids, stop_token=None):
        self.output_ids = list(output_ids)
        self.stop_token = stop_token
        self.grammar = None
        self.spec_verify_ct = 0
        self.spec_accepted_drafts = 0
        self.histogram: list[int] = []
        self.kv_committed_len = 0
        self.kv_allocated_len = 0
        self._finished = False

    def check_finished(self):
        self._finished = self.output_ids[-1] == self.stop_token

    def finished(self):
        return self._finished

    def update_spec_acceptance_histogram(self, accepted: int):
        self.histogram.append(accepted)


def fake_batch(reqs, prefix_lens, req_pool_indices, allocator):
    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)
    return SimpleNamespace(
        forward_mode=SimpleNamespace(is_idle=lambda: False),
        batch_size=lambda: len(reqs),
        reqs=reqs,
        device=torch.device("cpu"),
        sampling_info=None,
        seq_lens=seq_lens,
        seq_lens_cpu=seq_lens.clone(),
        seq_lens_sum=int(seq_lens.sum()),
        req_pool_indices=torch.tensor(req_pool_indices),
        req_to_token_pool=SimpleNamespace(req_to_token=torch.full((4, 32), -1, dtype=torch.int32)),
        tree_cache=SimpleNamespace(is_chunk_cache=lambda: True, token_to_kv_pool_allocator=allocator),
        token_to_kv_pool_allocator=allocator,
        input_ids=None,
        out_cache_loc=None,
    )


def test_one_tree_step_prepare_verify_commit(patched_sglang):
    from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput

    tree = hand_tree()
    n, vocab = 6, 64
    allocator = FakeAllocator(first_slot=1000)
    reqs = [FakeReq([7, 50]), FakeReq([8, 60], stop_token=24)]
    batch = fake_batch(reqs, prefix_lens=[4, 2], req_pool_indices=[2, 0], allocator=allocator)

    verify_input = DDTreeVerifyInput.from_step(StepTree.of_tree(tree, batch.seq_lens))
    assert verify_input.draft_token_num == n
    assert verify_input.positions.view(2, n).tolist() == [[4, 5, 5, 6, 6, 7], [2, 3, 4, 5, 3, 4]]
    verify_input.prepare_for_verify(batch, 1, build_custom_mask=True)
    assert torch.equal(batch.input_ids, tree.tokens.reshape(-1))
    assert batch.out_cache_loc.tolist() == list(range(1000, 1012))
    assert batch.req_to_token_pool.req_to_token[2, 4:10].tolist() == list(range(1000, 1006))
    assert verify_input.custom_mask.numel() == n * (4 + n) + n * (2 + n)

    # Target argmax after every node. Request 0: after root 12 (node 2, the second sibling),
    # after node 2 -> 14 (node 4), after node 4 -> 33 (no child: bonus). Request 1: after root
    # 24 (node 4) and 24 is its stop token, so the step commits one token.
    target_next = torch.full((2, n), 40)
    target_next[0, 0], target_next[0, 2], target_next[0, 4] = 12, 14, 33
    target_next[1, 0] = 24
    logits = torch.nn.functional.one_hot(target_next.view(-1), vocab).float()
    hidden = torch.arange(2 * n, dtype=torch.float32).view(2 * n, 1).repeat(1, 3)
    logits_output = SimpleNamespace(next_token_logits=logits, hidden_states=hidden)

    new_verified, commit_lens, next_hidden, accepted = verify_input.verify(
        batch=batch, logits_output=logits_output, page_size=1
    )
    assert reqs[0].output_ids == [7, 50, 12, 14, 33]
    assert reqs[1].output_ids == [8, 60, 24]
    assert new_verified.tolist() == [33, 24]
    assert commit_lens.tolist() == [3, 1]
    assert accepted == [2, 0]
    assert [r.spec_verify_ct for r in reqs] == [1, 1]
    assert [r.histogram for r in reqs] == [[2], [0]]
    assert [r.kv_committed_len for r in reqs] == [3, 1]
    # KV of root, node 2, node 4 (slots 1000, 1002, 1004) now at positions 4, 5, 6 of request 0
    assert batch.req_to_token_pool.req_to_token[2, 4:7].tolist() == [1000, 1002, 1004]
    assert batch.req_to_token_pool.req_to_token[0, 2:3].tolist() == [1006]
    assert sorted(allocator.freed) == [1001, 1003, 1005] + list(range(1007, 1012))
    assert batch.out_cache_loc.tolist() == [1000, 1002, 1004, 1006]
    assert next_hidden[:, 0].tolist() == [0.0, 2.0, 4.0, 6.0]
    assert batch.seq_lens.tolist() == [7, 3] and batch.seq_lens_cpu.tolist() == [7, 3]
    assert batch.seq_lens_sum == 10
    assert logits_output.hidden_states is None


def test_prepare_refuses_backends_without_tree_mask(patched_sglang):
    from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput

    batch = fake_batch([FakeReq([1])], [3], [0], FakeAllocator(0))
    tree = hand_tree(parents=[PARENTS[0]], tokens=[TOKENS[0]])
    verify_input = DDTreeVerifyInput.from_step(StepTree.of_tree(tree, batch.seq_lens))
    with pytest.raises(RuntimeError, match="--attention-backend triton"):
        verify_input.prepare_for_verify(batch, 1, build_custom_mask=False)


def test_sampled_first_and_second_tokens_follow_the_target_law(patched_sglang):
    """Without the kernel (CPU) the step samples through verify_sampling; the first two
    committed tokens must follow the target's autoregressive law at temperature 0.7."""
    from k26_ddtree.sglang.v0_5_11.ddtree_info import DDTreeVerifyInput

    draws, vocab, temperature = 40000, 6, 0.7
    # root -> {1, 2}; node 1 -> {3}; tokens chosen so some children carry mass, some not
    one = hand_tree(parents=[[-1, 0, 0, 1]], tokens=[[5, 1, 2, 3]], max_depth=2)
    tree = DDTree(*(t.expand(draws, -1).clone() for t in (one.tokens, one.parents, one.depths, one.node_logws)), max_depth=2)
    gen = torch.Generator().manual_seed(0)
    node_logits = torch.randn(4, vocab, generator=gen) * 1.5
    node_logits[0, 1] += 3.0  # the root's first child is likely, so its subtree gets many draws
    logits = node_logits.repeat(draws, 1)
    verify_input = DDTreeVerifyInput.from_step(StepTree.of_tree(tree, torch.zeros(draws, dtype=torch.long)))
    batch = SimpleNamespace(batch_size=lambda: draws, sampling_info=sampling_info(draws, temperature))
    torch.manual_seed(1)
    acceptance = verify_input.accept(batch, logits)
    packed, width = acceptance.rows, acceptance.width
    committed, path, accept_len = packed[:, :width], acceptance.path, packed[:, -1]
    tokens = committed[:, 0]

    law = torch.softmax(node_logits / temperature, dim=1)
    freq = torch.bincount(tokens, minlength=vocab).float() / draws
    assert torch.allclose(freq, law[0], atol=0.01)
    # second token given first = 1 follows node 1's law (its child 3 included)
    after_one = (accept_len > 0) & (path[:, 1] == 1)
    second = committed[:, 1][after_one]
    assert torch.equal(second == 3, accept_len[after_one] > 1), "token 3 is node 1's child, so it is accepted"
    freq2 = torch.bincount(second, minlength=vocab).float() / second.numel()
    assert torch.allclose(freq2, law[1], atol=0.02)


def test_trace_step_records_the_greedy_requests_of_a_mixed_batch_only(patched_sglang, tmp_path):
    from k26_ddtree.sglang.common import trace
    from k26_ddtree.sglang.v0_5_11.ddtree_info import HostCommit, trace_step

    depth = 3
    path = tmp_path / "t.trace"
    writer = trace.TraceWriter.open(path, {"depth": depth, "topk": trace.TOPK}, 1 << 20)
    tokens = torch.arange(3 * depth * trace.TOPK).view(3, depth, trace.TOPK)
    logprobs = -torch.arange(3 * depth * trace.TOPK, dtype=torch.float32).view(3, depth, trace.TOPK) / 100
    draft = trace.StepDraft.of(writer, torch.tensor([5, 6, 7]), tokens, logprobs)
    # SGLang's top_k after its normalisation: 1 for greedy (temperature 0), the vocabulary otherwise.
    reqs = [SimpleNamespace(rid=rid, spec_verify_ct=4, sampling_params=SimpleNamespace(top_k=k))
            for rid, k in (("greedy-a", 1), ("sampled", 1 << 30), ("greedy-b", 1))]
    host = HostCommit(commit_lens=[2, 1, 3], new_verified=[0, 0, 0], accepted=[1, 0, 2])
    trace_step(draft, reqs, [[1, 2, 9], [3, 9, 9], [4, 5, 6]], host, all_greedy=False)
    writer.close()

    _, steps = trace.read(path)
    keys = torch.tensor([trace.request_key("greedy-a"), trace.request_key("greedy-b")], dtype=torch.uint64)
    assert torch.equal(steps.request, keys.view(torch.int64)), "u64 keys read back as int64 of the same bits"
    assert steps.root.tolist() == [5, 7]
    assert torch.equal(steps.tokens, tokens[[0, 2]])
    assert steps.committed.tolist() == [[1, 2, -1, -1], [4, 5, 6, -1]]
    assert steps.step.tolist() == [3, 3]

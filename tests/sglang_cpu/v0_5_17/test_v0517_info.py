"""The 0.5.17 DDTree step state on small CPU tensors: the verify input's tokens, positions, mask and
slots (one verify token per tree node), the acceptance, and the on-device commit (the req_to_token
permutation, new_seq_lens, the scheduler's strided tokens and the draft append's inputs)."""

from __future__ import annotations

import pytest
import torch

from k26_ddtree.core.tree import DDTree
from k26_ddtree.sglang.common.step_graphs import StepTree

# Two requests, n = 6 nodes each (budget 5, depth cap 3).
#   request 0:  0 -> 1 -> 3 -> 5       request 1:  0 -> 1 -> 2 -> 3
#                 \-> 2 -> 4                         \-> 4     \-> 5
PARENTS = [[-1, 0, 0, 1, 2, 3], [-1, 0, 1, 2, 0, 1]]
TOKENS = [[50, 11, 12, 13, 14, 15], [60, 21, 22, 23, 24, 25]]
VOCAB = 64
PREFIX = [3, 5]
POOL = [2, 0]  # req_pool_indices


def hand_step(prefix=PREFIX) -> StepTree:
    depths = []
    for row in PARENTS:
        d = []
        for p in row:
            d.append(0 if p < 0 else d[p] + 1)
        depths.append(d)
    tree = DDTree(tokens=torch.tensor(TOKENS), parents=torch.tensor(PARENTS), depths=torch.tensor(depths),
                  node_logws=-torch.arange(6, dtype=torch.float32).expand(2, 6).clone(), max_depth=3)
    return StepTree.of_tree(tree, torch.tensor(prefix))


def req_to_token():
    """Row r holds 1000 * (r + 1) + column: every slot names its row and column."""
    return (torch.arange(3).unsqueeze(1) * 1000 + 1000 + torch.arange(32)).to(torch.int32)


def build(table=None):
    from k26_ddtree.sglang.v0_5_17.ddtree_info import DDTreeVerifyInputV2

    table = req_to_token() if table is None else table
    prefix = torch.tensor(PREFIX)
    return DDTreeVerifyInputV2.build(hand_step(), table, torch.tensor(POOL), prefix, prefix.clone()), table


def logits_for(target_next):
    """One-hot logits [B * 6, V] whose argmax after node i of request b is target_next[b][i]."""
    return torch.nn.functional.one_hot(torch.tensor(target_next).view(-1), VOCAB).float()


def test_verify_input_holds_the_tree_its_positions_mask_and_slots(patched_sglang):
    from sglang.srt.speculative.dflash_info import DFlashVerifyInput
    from sglang.srt.speculative.spec_info import SpecInputType

    verify, _ = build()
    assert isinstance(verify, DFlashVerifyInput) and verify.spec_input_type == SpecInputType.DFLASH_VERIFY
    assert verify.draft_token_num == verify.num_tokens_per_req == 6
    assert verify.draft_token.tolist() == TOKENS[0] + TOKENS[1]
    assert verify.positions.tolist() == [3, 4, 4, 5, 5, 6] + [5, 6, 7, 8, 6, 7]
    assert verify.node_slots.tolist() == [[3003 + i for i in range(6)], [1005 + i for i in range(6)]]
    mask = verify.custom_mask
    assert mask.numel() == 6 * (3 + 6) + 6 * (5 + 6)
    first = mask[: 6 * 9].view(6, 9)
    assert first[:, :3].all()
    assert first[5, 3:].tolist() == [True, True, False, True, False, True], "node 5 sees 0, 1, 3 and itself"


def test_greedy_acceptance_walks_the_target_argmax(patched_sglang):
    verify, _ = build()
    # Request 0 accepts 11 then 13, then the target offers 40; request 1 accepts 24 then offers 41.
    logits = logits_for([[11, 13, 1, 40, 1, 1], [24, 1, 1, 1, 41, 1]])
    acceptance = verify.accept(logits, sampling_info=None, max_top_k=1)
    assert acceptance.rows[:, -1].tolist() == [2, 1]
    assert acceptance.path.tolist() == [[0, 1, 3, -1], [0, 4, -1, -1]]


def test_commit_permutes_the_row_and_returns_what_the_scheduler_reads(patched_sglang):
    verify, table = build()
    before = table.clone()
    acceptance = verify.accept(logits_for([[11, 13, 1, 40, 1, 1], [24, 1, 1, 1, 41, 1]]), None, 1)
    hidden = torch.arange(12, dtype=torch.float32).view(12, 1) + 100
    prefix = torch.tensor(PREFIX)
    commit = verify.commit(acceptance, table, torch.tensor(POOL), prefix, hidden)

    assert table[2, 3:9].tolist() == [3003, 3004, 3006, 3005, 3007, 3008], "path 0, 1, 3 first, then 2, 4, 5"
    assert table[0, 5:11].tolist() == [1005, 1009, 1006, 1007, 1008, 1010], "path 0, 4 first, then 1, 2, 3, 5"
    untouched = torch.ones_like(table, dtype=torch.bool)
    untouched[2, 3:9] = untouched[0, 5:11] = False
    assert torch.equal(table[untouched], before[untouched]), "nothing else in req_to_token moves"
    assert sorted(table[2, 3:9].tolist()) == before[2, 3:9].tolist(), "every slot stays in the row"

    assert commit.commit_lens.dtype == torch.int32 and commit.commit_lens.tolist() == [3, 2]
    assert commit.new_seq_lens.tolist() == [6, 7]
    assert commit.bonus.tolist() == [40, 41]
    assert commit.out_tokens.tolist() == [[11, 13, 40, 0], [24, 41, 0, 0]], "stride P = 4, tokens then bonus"
    assert commit.draft_cache_loc.tolist() == [[3003, 3004, 3006, 3005], [1005, 1009, 1006, 1007]]
    assert commit.draft_positions.tolist() == [3, 4, 5, 6, 5, 6, 7, 8]
    assert commit.draft_hidden.view(-1).tolist()[:3] == [100, 101, 103]
    assert commit.draft_hidden.view(-1).tolist()[4:6] == [106, 110]


def test_commit_reads_nothing_from_the_device(patched_sglang, monkeypatch):
    """No .item(), .tolist() or .cpu() of a device value in build, accept or commit: the CPU
    tensors stand in for device ones, and every host read is refused."""
    verify, table = build()
    logits = logits_for([[11, 13, 1, 40, 1, 1], [24, 1, 1, 1, 41, 1]])
    for name in ("item", "tolist", "cpu", "__bool__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, lambda *a, **k: pytest.fail("host read in the step"))
    acceptance = verify.accept(logits, None, 1)
    verify.commit(acceptance, table, torch.tensor(POOL), torch.tensor(PREFIX), torch.zeros(12, 1))


def test_sampling_acceptance_keeps_to_the_tree_and_the_given_top_k(patched_sglang):
    from types import SimpleNamespace

    from k26_ddtree.sglang.common.verify_utils import target_probs

    verify, _ = build()
    torch.manual_seed(0)
    logits = torch.randn(12, VOCAB)
    info = SimpleNamespace(is_all_greedy=False, temperatures=torch.ones(2, 1), top_ks=torch.tensor([3, 5]),
                           top_ps=torch.ones(2), need_top_k_sampling=True, need_top_p_sampling=False)
    assert torch.equal(target_probs(logits, info, 6, max_top_k=5), target_probs(logits, info, 6))
    acceptance = verify.accept(logits, info, max_top_k=5)
    accept_len = acceptance.rows[:, -1]
    path = acceptance.path
    for b in range(2):
        nodes = path[b, : int(accept_len[b]) + 1].tolist()
        assert nodes[0] == 0 and all(PARENTS[b][c] == p for p, c in zip(nodes, nodes[1:]))
    probs = target_probs(logits, info, 6)
    last = [int(path[b, int(accept_len[b])]) for b in range(2)]
    bonus = acceptance.rows[torch.arange(2), accept_len]
    assert all(probs[b, last[b], int(bonus[b])] > 0 for b in range(2)), "the bonus is within top-k"

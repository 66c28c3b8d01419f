"""tune's acceptance replay: continuations from the trace, hand-computed trees, and agreement with the
proving ground's offline estimator (proving_ground.acceptance) on a trace a serving walk wrote."""

from __future__ import annotations

import pytest
import torch
from tune_fixtures import header, random_table, walk_records, write_trace

from k26_ddtree.core.acceptance import TreeShape, committed_every_budget, committed_per_root
from k26_ddtree.core.budget import codes_fit, max_budget
from k26_ddtree.errors import UserError
from proving_ground.acceptance import acceptance_table
from k26_ddtree.sglang.common import trace
from k26_ddtree.tune.estimate import acceptance, all_shapes, as_served, chain, replay

D = 3


def ranked_draft(depth_tokens: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """[1, D, 8] tokens (the given ranks first, then filler ids) and log-probs -(rank + depth)."""
    tokens = torch.tensor([[ranks + [900 + 10 * d + r for r in range(len(ranks), trace.TOPK)]
                            for d, ranks in enumerate(depth_tokens)]])
    logprobs = -(torch.arange(trace.TOPK, dtype=torch.float32).view(1, 1, -1) + torch.arange(D).view(1, D, 1))
    return tokens, logprobs


def record(rid: str, step: int, root: int, committed: list[int], draft=None) -> bytes:
    tokens, logprobs = draft or ranked_draft([[1, 2], [3, 4], [5, 6]])
    return trace.pack_records([trace.request_key(rid)], [step], [root], tokens, logprobs, [committed])


class Replayed:
    """A trace file's replay and what its steps commit under any shape."""

    def __init__(self, path):
        self.records = trace.open_records(path)
        self.rep = replay(self.records)

    def committed(self, shape: TreeShape) -> int:
        """Tokens the trace's steps commit under `shape`, summed."""
        return int(acceptance(self.records, self.rep, [shape]).sums.sum())

    def means(self, shapes: list[TreeShape]) -> dict:
        return acceptance(self.records, self.rep, shapes).means()


def read_replay(tmp_path, records: list[bytes]) -> Replayed:
    return Replayed(write_trace(tmp_path / "t.trace", header(D), records))


def test_a_steps_continuation_runs_on_through_the_requests_next_steps(tmp_path):
    # Written out of order, as several requests' steps interleave in a server's batches; b skips step 1.
    path = write_trace(tmp_path / "t.trace", header(D), [
        record("a", 1, 6, [7]), record("b", 2, 50, [51, 52]), record("a", 0, 4, [5, 6]),
        record("b", 0, 40, [41]), record("a", 2, 7, [8, 9, 10]),
    ])
    rep = Replayed(path).rep
    assert rep.truth.tolist() == [  # in file order
        [7, 8, 9, 10], [51, 52, -1, -1], [5, 6, 7, 8],
        [41, -1, -1, -1],  # b's step 1 was not traced: what follows step 0 is unknown
        [8, 9, 10, -1],  # a: the text ends at its last step
    ]
    assert (rep.steps, rep.requests, rep.short) == (5, 2, 3)


def test_hand_computed_acceptance_of_a_second_rank_path(tmp_path):
    # Ranks per depth: (20, 21), (30, 31), (40, 41); the target went 21, 30, 40, then 99.
    # Scores: rank r at depth d (0-based) costs r + d, so path (1, 0, 0) costs 1, 2, 4 by depth.
    #   chain b3k1: 20 misses -> 1 committed.   b2k2: root's children 20, 21 -> 21, then stop -> 2.
    #   b8k2-spine: spine (0), (0,0), (0,0,0), then (1), (0,1), (1,0), (1,1), (0,0,1): 21-30 -> 3.
    #   b6k2: (0), (1), (0,0), (0,1), (1,0), (1,1): 21-30 -> 3.   b14k2, every prefix: 21-30-40 -> 4.
    draft = ranked_draft([[20, 21], [30, 31], [40, 41]])
    replayed = read_replay(tmp_path, [trace.pack_records([1], [0], [7], *draft, [[21, 30, 40, 99]])])
    expected = {chain(D): 1, TreeShape(2, 2, False): 2, TreeShape(8, 2, True): 3, TreeShape(6, 2, False): 3,
                TreeShape(14, 2, False): 4}
    assert {shape: replayed.committed(shape) for shape in expected} == expected


def test_the_mean_is_over_steps_and_a_later_step_supplies_the_bonus(tmp_path):
    # Step 0 commits only 21 (its served tree lacked 21-30); step 1 commits 30, 40 and 99.
    first = trace.pack_records([1], [0], [7], *ranked_draft([[20, 21], [30, 31], [40, 41]]), [[21]])
    second = trace.pack_records([1], [1], [21], *ranked_draft([[30, 31], [40, 41], [50, 51]]), [[30, 40, 99]])
    replayed = read_replay(tmp_path, [first, second])
    assert replayed.rep.truth.tolist() == [[21, 30, 40, 99], [30, 40, 99, -1]]
    table = replayed.means([chain(D), TreeShape(14, 2, False)])
    assert table == {chain(D): (1 + 3) / 2, TreeShape(14, 2, False): (4 + 3) / 2}


def test_every_valid_shape_and_no_other():
    shapes = all_shapes(7)
    assert len(shapes) == 2 * (7 + 7 * 64) and chain(7) in shapes
    assert TreeShape(8, 1, False) not in shapes, "a chain of 7 holds 7 nodes at most"
    deep = all_shapes(11)  # codes need 2 * max(topk, 2)^min(11, budget) <= 2^31
    assert TreeShape(10, 8, True) in deep and TreeShape(11, 8, True) not in deep
    assert TreeShape(11, 7, False) not in deep and TreeShape(64, 6, False) in deep


def test_agrees_with_the_proving_grounds_estimator_on_the_steps_a_served_walk_visited(tmp_path):
    depth, served = 7, TreeShape(8, 4, True)
    tables = [random_table(seed, 60, depth) for seed in range(4)]
    records, visited = [], []
    for index, table in enumerate(tables):
        roots, written = walk_records(table, served, f"request-{index}")
        visited.append(roots)
        records += written
    path = write_trace(tmp_path / "walk.trace", header(depth), records)
    replayed = Replayed(path)
    assert replayed.rep.steps == sum(map(len, visited)) and replayed.rep.requests == len(tables)
    shapes = all_shapes(depth)[::7] + [served, chain(depth), TreeShape(64, 8, True)]
    table = replayed.means(shapes)
    for shape in shapes:
        offline = torch.cat([committed_per_root(t, shape)[v] for t, v in zip(tables, visited)]).double().mean()
        assert table[shape] == pytest.approx(float(offline), rel=1e-12), shape.name
    # Replayed under the shape that was served, the trace gives the served walk's own acceptance.
    assert table[served] == pytest.approx(acceptance_table(tables, [served])[served.name], rel=1e-12)
    assert table[TreeShape(64, 8, True)] > table[chain(depth)], "the drafter's 2nd-8th ranks pay off in a tree"


def test_draft_log_probs_the_builder_cannot_take_are_one_error(tmp_path):
    tokens, logprobs = ranked_draft([[20, 21], [30, 31], [40, 41]])
    logprobs[0, 1, 3] = float("nan")
    path = write_trace(tmp_path / "t.trace", header(D), [trace.pack_records([1], [0], [7], tokens, logprobs, [[20]])])
    with pytest.raises(UserError, match="1 of 1 steps carry draft log-probs that are not finite"):
        replay(trace.open_records(path))


def test_a_step_at_the_end_of_its_request_commits_at_most_the_tokens_left(tmp_path):
    # The request ended after 21, 30: the full tree matches both, and the bonus has nothing to take.
    replayed = read_replay(tmp_path, [trace.pack_records([1], [0], [7], *ranked_draft([[20, 21], [30, 31], [40, 41]]),
                                                         [[21, 30]])])
    assert replayed.rep.truth.tolist() == [[21, 30, -1, -1]]
    assert replayed.committed(TreeShape(14, 2, False)) == 2
    assert replayed.committed(chain(D)) == 1, "the chain's miss at depth 1 still commits the bonus"


def test_served_acceptance_counts_the_prefills_first_token_of_whole_requests(tmp_path):
    # a: steps 0-1, 1 + 3 tokens, traced whole; b: its step 0 missing, so it says nothing of its length.
    replayed = read_replay(tmp_path, [record("a", 0, 4, [5]), record("a", 1, 5, [6, 7, 8]),
                                      record("b", 1, 50, [51, 52])])
    rep = replayed.rep
    assert rep.served_scale == pytest.approx((1 + 4) / 4)
    table = replayed.means([chain(D)])
    assert as_served(table, rep) == {chain(D): pytest.approx(table[chain(D)] * 5 / 4)}
    assert read_replay(tmp_path, [record("b", 1, 50, [51, 52])]).rep.served_scale == 1.0, "no whole request: no scale"


@pytest.mark.parametrize("depth", [3, 7, 15])
def test_one_pass_per_topk_commits_what_a_tree_built_at_each_budget_commits(depth):
    """The best-first tree at a smaller budget is the first nodes of the tree at the largest: every
    budget's acceptance from one pass equals a tree built for that budget, spine off and on."""
    table = random_table(depth, 200, depth)
    for topk in range(1, trace.TOPK + 1):
        widest = max(b for b in range(1, 65) if b <= max_budget(depth, topk) and codes_fit(depth, topk, b))
        every = committed_every_budget(table, topk, widest)
        for spine in (False, True):
            for budget in range(1, widest + 1):
                built = committed_per_root(table, TreeShape(budget, topk, spine))
                assert torch.equal(every[int(spine), :, budget - 1], built), (topk, budget, spine)


def test_ties_in_the_draft_scores_order_nodes_as_the_builder_does(tmp_path):
    # Integer log-probs tie many prefixes: the key's path code must break them as the builder does.
    draft = ranked_draft([[20, 21], [30, 31], [40, 41]])
    tokens = draft[0].expand(6, -1, -1).clone()
    truth = torch.tensor([[21, 30, 40, 1], [20, 31, 41, 1], [21, 31, 41, 1], [20, 30, 41, 1], [20, 30, 40, 1],
                          [9, 9, 9, 9]])
    logprobs = torch.zeros(6, D, trace.TOPK)
    from k26_ddtree.core.acceptance import DraftTopK
    table = DraftTopK(tokens, logprobs, truth, torch.zeros(6, dtype=torch.long))
    every = committed_every_budget(table, 2, 14)
    for spine in (False, True):
        for budget in range(1, 15):
            assert torch.equal(every[int(spine), :, budget - 1], committed_per_root(table, TreeShape(budget, 2, spine)))

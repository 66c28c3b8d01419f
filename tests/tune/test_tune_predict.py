"""tune's prediction: tok/s = C x acceptance / step time, the best per C, the schedule, the spine."""

from __future__ import annotations

import math

import pytest
from tune_fixtures import bench_run, sweep_runs, write_results

from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.tune.costs import load_costs
from k26_ddtree.tune.estimate import all_shapes, chain
from k26_ddtree.tune.predict import Config, Plan, Prediction, choose, plan

D = 7


def made_up_acceptance() -> dict[TreeShape, float]:
    """Grows with the budget, a little with topk, more with the spine; the chain commits 3.0."""
    table = {s: 1.5 + 0.4 * math.log2(s.budget) + 0.02 * s.topk + (0.3 if s.spine else 0.0) for s in all_shapes(D)}
    table[chain(D)] = 3.0
    return table


@pytest.fixture
def costs(tmp_path):
    runs = sweep_runs(budgets=(1, 8, 16, 32, 64)) + [bench_run(lambda ctx, c: 0.020 + 0.0001 * c, algorithm="DFLASH")]
    return load_costs(write_results(tmp_path / "sweep.json", runs))


def test_every_prediction_is_c_times_acceptance_over_the_step_time_and_the_best_is_the_argmax(costs):
    acceptance = made_up_acceptance()
    p = plan(acceptance, D, costs, [1, 4, 16, 64], spine=True, budgets=range(1, 65))
    for c, ranked in p.ranked.items():
        assert len(ranked) == 7 + 7 * 64 + 1, "every spine shape and the DFlash chain"
        for q in ranked:
            step = costs.chain[c] if q.config.dflash else costs.step_s(c, q.config.shape.budget)
            assert q.tok_s == pytest.approx(c * acceptance[q.config.shape] / step)
        assert [q.tok_s for q in ranked] == sorted((q.tok_s for q in ranked), reverse=True)
        brute = max((c * acceptance[s] / costs.step_s(c, s.budget), s) for s in acceptance if s.spine)
        assert p.best(c).tok_s >= brute[0] and p.runner_up(c).tok_s <= p.best(c).tok_s
    # A verify-bound step grows with C * (budget + 1): big trees win alone, small ones in a crowd.
    assert p.best(1).config.shape.budget > p.best(16).config.shape.budget
    assert p.best(64).config.dflash, "at C=64 the chain, measured cheaper than any tree, wins"


def test_the_schedule_starts_at_1_and_between_levels_merges_equal_neighbours_and_writes_0_for_the_chain():
    def best(c: int, config: Config) -> list[Prediction]:
        return [Prediction(config, c, 3.0, 0.01)]

    big, small = Config(TreeShape(32, 8, True)), Config(TreeShape(8, 4, True))
    dflash = Config(chain(D), dflash=True)
    p = Plan(spine=True, ranked={16: best(16, small), 2: best(2, big), 4: best(4, big), 64: best(64, dflash)})
    # Each later bucket from the geometric midpoint of its level and the one before: 8 of 4 and 16.
    assert p.schedule() == "1:32/8,8:8/4,32:0"
    assert [(start, won) for start, _, won in p.buckets()] == [(1, [2, 4]), (8, [16]), (32, [64])]
    neighbours = Plan(spine=True, ranked={1: best(1, big), 2: best(2, small), 3: best(3, dflash), 5: best(5, big)})
    assert neighbours.schedule() == "1:32/8,2:8/4,3:0,4:32/8", "ceil(sqrt(2)) = 2, ceil(sqrt(6)) = 3, ceil(sqrt(15)) = 4"
    assert dflash.reconfigure() == "sudo k26-deploy reconfigure --set speculative.algorithm=DFLASH"
    assert big.reconfigure() == ("sudo k26-deploy reconfigure --budget 32 --topk 8 "
                                 "--set speculative.algorithm=DDTREE --set speculative.spine=true")


def test_one_spine_for_every_bucket_the_one_that_keeps_more_of_the_best(costs):
    acceptance = made_up_acceptance()
    on, off = (plan(acceptance, D, costs, [1, 64], spine=s, budgets=range(1, 65)) for s in (True, False))
    assert choose([off, on]) is on, "the spine adds 0.3 tokens per step at the same cost"
    flat = {s: 3.0 for s in acceptance}
    tie_on, tie_off = (plan(flat, D, costs, [1, 64], spine=s, budgets=range(1, 65)) for s in (True, False))
    assert choose([tie_off, tie_on]) is tie_on, "a tie keeps the shipped default, the spine"
    without = {s: value + (0.5 if not s.spine and s.topk > 1 else 0.0) for s, value in acceptance.items()}
    plans = [plan(without, D, costs, [1, 64], spine=s, budgets=range(1, 65)) for s in (True, False)]
    assert choose(plans).spine is False


def test_the_search_keeps_to_the_budgets_asked(costs):
    p = plan(made_up_acceptance(), D, costs, [1], spine=False, budgets=range(8, 17))
    budgets = {q.config.shape.budget for q in p.ranked[1] if not q.config.dflash}
    assert budgets == set(range(8, 17))

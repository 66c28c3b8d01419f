"""tune's cost model: step times from bench results files (made by the bench code, and one committed
file written by `k26-deploy bench` against live servers), interpolation, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean

import pytest
from tune_fixtures import bench_run, sweep_runs, tree_step_s, write_results

from k26_ddtree.errors import UserError
from k26_ddtree.tune.costs import load_costs

REPO = Path(__file__).resolve().parents[2]
LIVE = REPO / "bench/results/2026-11-30-tiny-lossless-small-budgets-spine-bench/bench-harness/bench-harness.json"


def test_a_cells_step_time_is_c_times_acceptance_over_tok_s(tmp_path):
    path = write_results(tmp_path / "sweep.json", sweep_runs(budgets=(8, 16), topks=(4,)))
    costs = load_costs(path)
    cell = json.loads(path.read_text())["runs"][0]["cells"][0]
    assert cell["concurrency"] * cell["accept_length"] / cell["output_tok_s"] == pytest.approx(tree_step_s(8)(60, 1))
    for c in (1, 4, 16, 64):
        for budget in (8, 16):
            assert costs.tree[c][budget] == pytest.approx(fmean(tree_step_s(budget)(ctx, c) for ctx in (60, 1024)))
    assert costs.contexts == (60, 1024) and costs.concurrencies() == [1, 4, 16, 64]
    assert costs.block_sizes == {8} and {"kimi-k2.6", "/models/Kimi-K2.6"} <= costs.models


def test_between_measured_budgets_the_step_time_is_linear_and_outside_it_is_missing(tmp_path):
    costs = load_costs(write_results(tmp_path / "sweep.json", sweep_runs(budgets=(8, 16, 64), topks=(4,))))
    for c in (1, 64):
        assert costs.step_s(c, 12) == pytest.approx((costs.tree[c][8] + costs.tree[c][16]) / 2)
        assert costs.step_s(c, 40) == pytest.approx((costs.tree[c][16] + costs.tree[c][64]) / 2)
        assert costs.step_s(c, 16) == costs.tree[c][16]
    costs.require([1, 4], 8, 64)
    with pytest.raises(UserError, match=r"costs missing for budget 1 at C=1: .* measured budgets 8, 16, 64 there "
                                        r"and tune never extrapolates; sweep budget 1 too, or search --min-budget 8 "
                                        r"--max-budget 64"):
        costs.require([1], 1, 64)
    with pytest.raises(UserError, match="costs missing at C=128: .* has DDTree step times at C=1, 4, 16, 64"):
        costs.require([1, 128], 8, 64)
    short = load_costs(write_results(tmp_path / "short.json", sweep_runs(budgets=(8, 32), topks=(4,))))
    with pytest.raises(UserError, match="costs missing for budget 64 at C=4"):
        short.require([4], 8, 64)


def test_runs_of_one_budget_take_their_median_and_their_spread_is_said(tmp_path):
    slow = lambda ctx, c: 1.1 * tree_step_s(8)(ctx, c)  # noqa: E731
    runs = [bench_run(tree_step_s(8), algorithm="DDTREE", budget=8, topk=4),
            bench_run(slow, algorithm="DDTREE", budget=8, topk=8)]
    costs = load_costs(write_results(tmp_path / "sweep.json", runs))
    assert costs.tree[1][8] == pytest.approx(1.05 * fmean(tree_step_s(8)(ctx, 1) for ctx in (60, 1024)))
    assert any("differ in step time by up to 10.0%; their median is used" in note for note in costs.notes)
    stalled = lambda ctx, c: 3.0 * tree_step_s(8)(ctx, c)  # noqa: E731
    rounds = load_costs(write_results(tmp_path / "rounds.json", [*runs, bench_run(stalled, algorithm="DDTREE",
                                                                                budget=8, topk=4)]))
    assert rounds.tree[1][8] == pytest.approx(1.1 * fmean(tree_step_s(8)(ctx, 1) for ctx in (60, 1024))), \
        "one stalled round of three does not move the step time"


def test_dflash_is_the_chain_ar_the_baseline_and_neither_a_tree_point(tmp_path):
    dflash = lambda ctx, c: 0.030  # noqa: E731
    ar = lambda ctx, c: 0.010 * c  # noqa: E731
    runs = sweep_runs(budgets=(8,), topks=(4,)) + [bench_run(dflash, algorithm="DFLASH", accept=4.0),
                                                   bench_run(ar, algorithm="AR")]
    costs = load_costs(write_results(tmp_path / "sweep.json", runs))
    assert costs.chain == pytest.approx({1: 0.030, 4: 0.030, 16: 0.030, 64: 0.030})
    assert costs.ar_tok_s == pytest.approx({c: c / (0.010 * c) for c in (1, 4, 16, 64)})
    assert all(list(points) == [8] for points in costs.tree.values())
    assert [run.kind for run in costs.runs] == ["DDTREE", "DFLASH", "AR"]


def test_a_cell_with_failed_requests_drops_that_point_and_says_so(tmp_path):
    runs = [bench_run(tree_step_s(8), algorithm="DDTREE", budget=8, topk=4, errors_at={(1024, 64)}),
            bench_run(tree_step_s(16), algorithm="DDTREE", budget=16, topk=4)]
    costs = load_costs(write_results(tmp_path / "sweep.json", runs))
    assert list(costs.tree[64]) == [16] and list(costs.tree[16]) == [8, 16]
    assert "run DDTREE b8 k4 at C=64 not used: no clean cell at every context 60, 1024" in costs.notes[0]
    with pytest.raises(UserError, match="costs missing for budget 8 at C=64"):
        costs.require([64], 8, 16)


def test_context_picks_the_cells_that_count(tmp_path):
    costs = load_costs(write_results(tmp_path / "sweep.json", sweep_runs(budgets=(8,), topks=(4,))), (1024,))
    assert costs.contexts == (1024,) and costs.tree[4][8] == pytest.approx(tree_step_s(8)(1024, 4))


def test_the_committed_live_bench_file_costs_its_ddtree_and_dflash_runs():
    costs = load_costs(LIVE)
    runs = json.loads(LIVE.read_text())["runs"]
    for c in (1, 8):
        # Two b8/k4 runs (spine off and on), which that file still labels DFLASH with a budget.
        expected = fmean(fmean(c * cell["accept_length"] / cell["output_tok_s"] for cell in run["cells"]
                               if cell["concurrency"] == c) for run in runs[1:])
        assert costs.tree[c] == {8: pytest.approx(expected)}
        assert c in costs.chain
    assert costs.contexts == (60, 512) and "/tmp/k26/models/target" in costs.models
    assert costs.block_sizes == {8}


@pytest.mark.parametrize("runs, message", [
    ([], "holds no DDTree run"),
    ([bench_run(tree_step_s(8), algorithm="DFLASH")], "holds no DDTree run"),
    (sweep_runs(budgets=(8,), topks=(4,)) + sweep_runs(budgets=(16,), topks=(4,), model="/models/Other"),
     "mixes runs of different models"),
    (sweep_runs(budgets=(8,), topks=(4,)) + sweep_runs(budgets=(16,), topks=(4,), profile="nvlink-tp8-nvls"),
     "mixes runs of different profiles"),
])
def test_costs_that_cannot_cost_trees_are_one_error(tmp_path, runs, message):
    with pytest.raises(UserError, match=message):
        load_costs(write_results(tmp_path / "sweep.json", runs))


def test_a_step_time_comes_from_its_own_budget_or_the_two_around_it_and_never_from_outside():
    from k26_ddtree.tune.costs import bracket, interpolate

    points = {8: 0.04, 16: 0.05, 32: 0.08}
    assert bracket(points, 16) == (16,) and bracket(points, 24) == (16, 32)
    assert interpolate(points, 24) == pytest.approx(0.065)
    for outside in (4, 33):
        with pytest.raises(ValueError, match="outside the measured budgets"):
            interpolate(points, outside)

"""The K2.6 cost model: the H200 layer refit, the expert layouts, each box's fit and its CLI."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
from pathlib import Path

import pytest

from proving_ground.emulator import calibration as cal

REPO = Path(__file__).resolve().parents[2]


def test_h200_layer_refit_reproduces_the_field_table():
    for n, t in cal.H200_MARLIN_US:
        assert abs(cal.h200_layer_us(n, n) / t - 1) < 0.04
    # The two-term fit (22.8 + 1.08 per distinct) and the refit agree up to N = 128.
    for n, _ in cal.H200_MARLIN_US:
        assert abs(cal.h200_layer_us(n, n) / (22.8 + 1.08 * cal.distinct(n)) - 1) < 0.06


def test_correlated_routing_matches_the_field_rho_half_figures():
    for n, t in cal.H200_RHO05_US:
        assert abs(cal.h200_layer_us(cal.effective_tokens(n, 1, 0.5), n) / t - 1) < 0.08
    # ρ acts inside a request: a decode batch (one token each) routes independently at any ρ.
    assert cal.effective_tokens(1, 64, 0.9) == 64


def test_expected_max_binomial_against_enumeration():
    n, p, k = 3, 0.3, 2
    pmf = [math.comb(n, j) * p ** j * (1 - p) ** (n - j) for j in range(n + 1)]
    exact = sum(max(a, b) * pmf[a] * pmf[b] for a, b in itertools.product(range(n + 1), repeat=2))
    assert cal._expected_max_binomial(n, p, k) == pytest.approx(exact)


def test_expert_layouts():
    # One token: TP8 reads a slice of each of its 8 experts; EP8's busiest rank holds 2-3 of them.
    assert cal.expert_slices(1, "tp") == pytest.approx(8)
    assert 16 < cal.expert_slices(1, "ep") < 24
    # Every expert touched: both layouts read the same bytes per rank.
    assert cal.expert_slices(1e5, "ep") == pytest.approx(cal.expert_slices(1e5, "tp"))


@pytest.mark.parametrize("name", cal.box_names())
def test_each_box_reproduces_its_fit_points(name):
    box = cal.read_box(name)
    costs = cal.fit(box)
    assert costs.fixed_us > 0 and costs.expert_us > 0
    for row in cal.rows(box, costs):
        if row["kind"] == "fitted":
            assert row["error_pct"] == pytest.approx(0, abs=1e-6)
    assert cal.Costs.from_block(costs.to_block()) == costs


def test_static_part_is_zero_for_an_empty_batch_and_modes_are_checked():
    costs = cal.load("pcie-tp8")
    assert costs.static_us("decode", 0, 0) == 0
    with pytest.raises(ValueError):
        costs.static_us("draft", 8, 1)
    # The drafter is paid in verify steps only.
    gap = costs.static_us("target_verify", 8, 1) - costs.static_us("extend", 8, 1)
    assert gap == pytest.approx(costs.draft_us + costs.draft_us_per_request)


def test_calibration_markdown_is_current():
    assert (cal.BOXES / "CALIBRATION.md").read_text() == cal.markdown()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "proving_ground.emulator.calibration", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def test_cli_prints_the_table():
    done = _cli("--box", "pcie-ep8")
    assert done.returncode == 0, done.stderr
    assert "fixed_us" in done.stdout and "predicted  b8/k4" in done.stdout


@pytest.mark.parametrize("args", [("--box", "nope"), ("--box", "pcie-ep8", "--rho", "2"),
                                  ("--box", "pcie-ep8", "--rho", "nan"), (), ("--markdown", "--rho", "0.5")])
def test_cli_bad_input_is_one_line_and_exit_2(args):
    done = _cli(*args)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1

"""tune's predictions against a measured speed table (proving_ground.tuning), on the files the
proving ground committed: the widened target, tune run on the device."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from proving_ground import speed, tuning

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-12-01-wide-weak-schedule-bench-costs"
TUNE, SPEED = RESULTS / "wide-tune" / "tune.json", RESULTS / "wide-speed" / "e2e-runwide-speed.json"


def test_every_served_config_meets_its_prediction_and_the_schedule_its_rivals():
    result = tuning.check(TUNE, [SPEED], "ddtree-stuned-weak-spine")
    rows = {(r["server"], r["concurrency"]): r for r in result["rows"]}
    assert len(rows) == 20, "5 servers x C in 1, 4, 16, 64"
    b8 = rows[("ddtree-b8-k4-weak-spine", 1)]
    assert b8["measured_tok_s"] == pytest.approx(315.8)
    assert b8["acceptance_error"] == pytest.approx(4.39 / 4.491 - 1, abs=0.003)
    assert rows[("dflash-weak", 64)]["predicted_tok_s"] == pytest.approx(3106, abs=1)
    verdicts = {v["concurrency"]: v for v in result["verdicts"]}
    assert verdicts[1]["best_single"] == "ddtree-b32-k8-weak-spine"
    assert verdicts[1]["vs_best"] == pytest.approx(367.2 / 341.1)
    assert verdicts[4]["vs_dflash"] == pytest.approx(649.0 / 683.3)
    table = tuning.markdown(result)
    assert "| ddtree-stuned-weak-spine | 4 | 649 | 844 | +30.0% |" in table
    assert "| 64 | 6024 | ddtree-b8-k4-weak-spine | 5821 | 1.03 | 1.34 |" in table


def test_the_committed_check_is_what_the_tool_prints():
    assert (RESULTS / "tune-check.md").read_text() == tuning.markdown(
        tuning.check(TUNE, [SPEED], "ddtree-stuned-weak-spine"))


def test_a_missing_file_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "proving_ground.tuning", "--tune", str(tmp_path / "none.json"),
                           "--speed", str(SPEED), "--schedule-server", "x"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("tuning: error:")


def _tool(tmp_path, speed: dict, tune: dict | None = None, *extra: str) -> subprocess.CompletedProcess:
    tune_path, speed_path = tmp_path / "tune.json", tmp_path / "speed.json"
    tune_path.write_text(json.dumps(tune or {"predictions": [], "per_concurrency": []}))
    speed_path.write_text(json.dumps(speed))
    return subprocess.run([sys.executable, "-m", "proving_ground.tuning", "--tune", str(tune_path), "--speed",
                           str(speed_path), "--schedule-server", "ddtree-smine-real", *extra],
                          capture_output=True, text=True)


def _cell(server: str, tok_s, c: int = 1) -> dict:
    return {"cell": f"greedy-c{c}", "server": server, "median_tok_s": tok_s}


def test_a_table_of_the_schedule_alone_has_no_rival_to_show(tmp_path):
    tune = {"predictions": [], "per_concurrency": [{"concurrency": 1, "best": {"acceptance": 2.0, "tok_s": 60.0}}]}
    proc = _tool(tmp_path, {"speed": [_cell("ddtree-smine-real", 50.0)]}, tune)
    assert proc.returncode == 0, proc.stderr
    assert "| ddtree-smine-real | 1 | 50 | 60 | +20.0% |" in proc.stdout
    assert "| 1 | 50 | - | - | - | - |" in proc.stdout


def test_the_schedule_at_a_concurrency_tune_did_not_predict_is_measured_only(tmp_path):
    proc = _tool(tmp_path, {"speed": [_cell("ddtree-smine-real", 50.0, 4), _cell("dflash", 40.0, 4)]})
    assert proc.returncode == 0, proc.stderr
    assert "| ddtree-smine-real | 4 | 50 | - | - |" in proc.stdout
    assert "| 4 | 50 | dflash | 40 | 1.25 | 1.25 |" in proc.stdout


@pytest.mark.parametrize("out", ["dir", "file/x.json"])
def test_bad_values_and_unwritable_outputs_are_one_line_and_exit_2(tmp_path, out):
    (tmp_path / "dir").mkdir()
    (tmp_path / "file").write_text("")
    proc = _tool(tmp_path, {"speed": [_cell("ddtree-smine-real", "fast")]})
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and proc.stderr.startswith("tuning: error:")
    proc = _tool(tmp_path, {"speed": [_cell("ddtree-smine-real", 50.0)]}, None, "--out", str(tmp_path / out))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == "" and not (tmp_path / out).with_suffix(".md").exists()


def test_a_schedule_of_the_chain_everywhere_is_checked_as_the_dflash_server(tmp_path):
    """tune chose DFLASH at every C: the DFLASH server is the schedule's, predicted by tune's best."""
    tune = {"predictions": [], "per_concurrency": [{"concurrency": 1, "best": {"acceptance": 7.9, "tok_s": 90.0}}]}
    speed = {"speed": [_cell("dflash", 100.0), _cell("ddtree-b8-k4-real-spine", 80.0)]}
    tune_path, speed_path = tmp_path / "tune.json", tmp_path / "speed.json"
    tune_path.write_text(json.dumps(tune))
    speed_path.write_text(json.dumps(speed))
    result = tuning.check(tune_path, [speed_path], "dflash")
    row = next(r for r in result["rows"] if r["server"] == "dflash")
    assert row["tok_s_error"] == pytest.approx(-0.1)
    assert result["verdicts"] == [{"concurrency": 1, "schedule_tok_s": 100.0, "best_single": "ddtree-b8-k4-real-spine",
                                   "best_single_tok_s": 80.0, "dflash_tok_s": 100.0, "vs_best": 1.25,
                                   "vs_dflash": 1.0, "same_config": None, "vs_same_config": None,
                                   "vs_best_interval": None, "vs_dflash_interval": None,
                                   "vs_same_config_interval": None}]


MID = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-12-01-wide-mid-schedule"


def test_two_tables_pool_and_the_schedule_meets_its_own_config_as_an_a_a_pair():
    """Two back-to-back tables of the mid drafter: every cell is the mean of the two
    medians, and where the schedule serves b16k4-spine (C = 4 and 16) the b16 server is its twin."""
    tables = [MID / run / "e2e-runwide-speed-mid.json" for run in ("wide-speed-mid", "wide-speed-mid-2")]
    result = tuning.check(MID / "wide-tune-mid" / "tune" / "mid" / "tune.json", tables, "ddtree-stunedmid-mid-spine")
    rows = {(r["server"], r["concurrency"]): r for r in result["rows"]}
    b16 = rows[("ddtree-b16-k4-mid-spine", 16)]
    assert b16["table_medians"] == [2125.3, 1886.7] and b16["measured_tok_s"] == pytest.approx(2006.0)
    verdicts = {v["concurrency"]: v for v in result["verdicts"]}
    assert {c: v["same_config"] for c, v in verdicts.items()} == {
        1: None, 4: "ddtree-b16-k4-mid-spine", 16: "ddtree-b16-k4-mid-spine", 64: None}
    assert verdicts[4]["vs_same_config"] == pytest.approx((936.5 + 715.6) / (843.6 + 834.0))
    table = tuning.markdown(result)
    assert "| ddtree-b16-k4-mid-spine | 16 | 2006 (2125 / 1887) |" in table
    assert "| 4 | ddtree-b16-k4-mid-spine | 0.98 |" in table and "mean of 2 tables' medians" in table
    assert (MID / "tune-check-pooled.md").read_text() == table


def test_tables_of_different_servers_are_not_pooled(tmp_path):
    first, second = tmp_path / "a.json", tmp_path / "b.json"
    first.write_text(json.dumps({"speed": [_cell("ddtree-smine-real", 50.0), _cell("dflash", 40.0)]}))
    second.write_text(json.dumps({"speed": [_cell("ddtree-smine-real", 52.0)]}))
    (tmp_path / "tune.json").write_text(json.dumps({"predictions": [], "per_concurrency": []}))
    proc = subprocess.run([sys.executable, "-m", "proving_ground.tuning", "--tune", str(tmp_path / "tune.json"),
                           "--speed", str(first), "--speed", str(second), "--schedule-server", "ddtree-smine-real"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1
    assert "do not hold the same cells (dflash C=1 is missing from some)" in proc.stderr


def test_an_a_a_twin_serves_the_same_config_with_the_same_drafter(tmp_path):
    """The schedule chose the chain at C=1: only the DFLASH server of its own drafter is its twin,
    and a tune file whose best entries are malformed names no twin instead of failing."""
    tune = {"predictions": [], "per_concurrency": [
        {"concurrency": 1, "best": {"dflash_chain": True, "acceptance": 6.0, "tok_s": 60.0}},
        {"concurrency": 4, "best": None}]}
    speed = {"speed": [_cell("ddtree-smine-mid-spine", 50.0), _cell("dflash", 45.0), _cell("dflash-mid", 40.0),
                       _cell("ddtree-smine-mid-spine", 70.0, 4), _cell("dflash-mid", 60.0, 4)]}
    tune_path, speed_path = tmp_path / "tune.json", tmp_path / "speed.json"
    tune_path.write_text(json.dumps(tune))
    speed_path.write_text(json.dumps(speed))
    result = tuning.check(tune_path, [speed_path], "ddtree-smine-mid-spine")
    verdicts = {v["concurrency"]: v for v in result["verdicts"]}
    assert verdicts[1]["same_config"] == "dflash-mid" and verdicts[1]["vs_same_config"] == pytest.approx(1.25)
    assert verdicts[4]["same_config"] is None


def _repeats(*tables: list[float]) -> dict:
    return {"table_repeats": [list(t) for t in tables]}


def test_a_ratio_interval_holds_one_for_a_table_against_itself_and_not_for_a_clear_gap():
    same = _repeats([380, 350, 410, 395, 360])
    assert speed.ratio_interval(same, same) == [1.0, 1.0], "the same rounds drawn for both"
    low, high = speed.ratio_interval(same, _repeats([360, 395, 350, 410, 380]))
    assert low < 1 < high
    assert speed.ratio_interval(_repeats([200] * 5, [210] * 5), _repeats([100] * 5, [105] * 5)) == [2.0, 2.0]
    assert speed.ratio_interval(same, {"table_repeats": None}) is None
    assert speed.ratio_interval(same, _repeats([300, 320, 310, 330, 305])) == speed.ratio_interval(
        same, _repeats([300, 320, 310, 330, 305])), "seeded"


S8 = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-12-01-wide-mid-schedule-cost-rounds"


def test_session_8s_pooled_tables_carry_intervals_and_the_committed_check_is_what_the_tool_prints():
    """Tables that keep every repeat's rate (the mid drafter, costs in rounds): each ratio gets its bootstrap interval over the
    rounds. Against the best single config the schedule is nowhere measurably slower (every upper
    bound over 1) and at C=16 measurably faster; so it is against DFLASH at C=16."""
    tables = [S8 / run / "e2e-runwide-speed-mid.json" for run in ("wide-speed-mid", "wide-speed-mid-2")]
    result = tuning.check(S8 / "wide-tune-mid" / "tune" / "mid" / "tune.json", tables, "ddtree-stunedmid-mid-spine")
    verdicts = {v["concurrency"]: v for v in result["verdicts"]}
    assert all(v["vs_best_interval"][1] > 1 for v in verdicts.values())
    assert verdicts[16]["vs_best_interval"][0] > 1 and verdicts[16]["vs_dflash_interval"][0] > 1
    assert all(v["vs_best_interval"][0] < 1 for c, v in verdicts.items() if c != 16)
    assert verdicts[16]["same_config"] == "dflash-mid"
    assert (S8 / "tune-check-pooled.md").read_text() == tuning.markdown(result)


@pytest.mark.parametrize("top, bottom", [
    ([[380, 0.0, 410]], [[300, 310, 320]]),  # a repeat whose every request failed
    ([[380, 390]], [[300, 310]]),  # fewer than 3 rounds: an interval would read as certainty
    ([[380, 390, 400]], [[300, 310, 320, 330]]),  # not the same rounds
    ([[380, 390, 400]], [[300, 310, 320], [300, 310, 320]]),  # not the same tables
])
def test_a_ratio_interval_is_none_where_the_repeats_cannot_be_paired_by_round(top, bottom):
    assert speed.ratio_interval(_repeats(*top), _repeats(*bottom)) is None


def _rated(server: str, rates: list[float], c: int = 1, errors: int = 0) -> dict:
    return {**_cell(server, sorted(rates)[len(rates) // 2], c), "repeat_tok_s": rates, "errors": errors}


def test_intervals_skip_failed_cells_and_a_chain_only_schedule_against_itself(tmp_path):
    tune = {"predictions": [], "per_concurrency": [{"concurrency": 1, "best": {"dflash_chain": True,
                                                                               "acceptance": 6.0, "tok_s": 60.0}}]}
    speed = {"speed": [_rated("dflash-mid", [100, 104, 98]), _rated("ddtree-b8-k4-mid-spine", [90, 95, 93]),
                       _rated("ddtree-b16-k4-mid-spine", [120, 0.0, 125], errors=3)]}
    tune_path, speed_path = tmp_path / "tune.json", tmp_path / "speed.json"
    tune_path.write_text(json.dumps(tune))
    speed_path.write_text(json.dumps(speed))
    verdict = tuning.check(tune_path, [speed_path], "dflash-mid")["verdicts"][0]
    assert verdict["vs_dflash"] == 1.0 and verdict["vs_dflash_interval"] is None
    assert verdict["best_single"] == "ddtree-b16-k4-mid-spine" and verdict["vs_best_interval"] is None
    speed["speed"][2] = _rated("ddtree-b16-k4-mid-spine", [50, 52, 51])
    speed_path.write_text(json.dumps(speed))
    verdict = tuning.check(tune_path, [speed_path], "dflash-mid")["verdicts"][0]
    low, high = verdict["vs_best_interval"]
    assert verdict["best_single"] == "ddtree-b8-k4-mid-spine" and 1 < low <= high


def test_the_interval_note_is_printed_when_only_an_a_a_pair_has_one():
    result = {"rows": [], "verdicts": [{"concurrency": 4, "schedule_tok_s": 50.0, "best_single": None,
                                        "best_single_tok_s": None, "vs_best": None, "vs_dflash": None,
                                        "same_config": "dflash-mid", "vs_same_config": 1.1,
                                        "vs_same_config_interval": [0.9, 1.3]}]}
    table = tuning.markdown(result)
    assert "| 4 | dflash-mid | 1.10 (0.90-1.30) |" in table and "bootstrap interval over the table's rounds" in table


def _spec_cell(server: str, tok_s: float, accept: float, c: int) -> dict:
    return {**_cell(server, tok_s, c), "accept_length": accept}


def test_tunes_model_on_step_times_from_the_same_table_predicts_what_those_cells_do_not_hold(tmp_path):
    """Steps at C=4 (C x acceptance / tok/s): DFLASH 40 ms, b8 40, b16 50, b32 80 ms. The schedule's
    b24/k2 is costed between b16 and b32 (65 ms); b16 between b8 and b32 without its own cell
    (53.3 ms); b8 and b32 have no budget on both sides; the chain's pick at C=1 takes DFLASH's step;
    another drafter's DFLASH is never used."""
    tune = {"predictions": [{"config": "b16k4-spine", "dflash_chain": False, "acceptance": 5.1, "predicted": {}}],
            "per_concurrency": [
                {"concurrency": 1, "best": {"dflash_chain": True, "acceptance": 4.1, "tok_s": 1.0}},
                {"concurrency": 4, "best": {"config": "b24k2-spine", "budget": 24, "dflash_chain": False,
                                            "acceptance": 5.2, "tok_s": 1.0}}]}
    speed = {"speed": [_spec_cell("dflash-weak", 400.0, 4.0, 4), _spec_cell("ddtree-b8-k4-weak-spine", 450.0, 4.5, 4),
                       _spec_cell("ddtree-b16-k4-weak-spine", 400.0, 5.0, 4),
                       _spec_cell("ddtree-b32-k8-weak-spine", 275.0, 5.5, 4),
                       _spec_cell("ddtree-smine-weak-spine", 300.0, 5.2, 4),
                       _spec_cell("dflash-weak", 100.0, 4.0, 1), _spec_cell("dflash", 50.0, 4.0, 1),
                       _spec_cell("ddtree-smine-weak-spine", 110.0, 4.1, 1)]}
    tune_path, speed_path = tmp_path / "tune.json", tmp_path / "speed.json"
    tune_path.write_text(json.dumps(tune))
    speed_path.write_text(json.dumps(speed))
    result = tuning.check(tune_path, [speed_path], "ddtree-smine-weak-spine")
    rows = {(r["server"], r["concurrency"]): r for r in result["same_table"]}
    assert set(rows) == {("ddtree-smine-weak-spine", 1), ("ddtree-smine-weak-spine", 4), ("ddtree-b16-k4-weak-spine", 4)}
    assert rows[("ddtree-smine-weak-spine", 4)]["predicted_tok_s"] == pytest.approx(4 * 5.2 / 0.065)
    assert rows[("ddtree-smine-weak-spine", 4)]["costed_from"] == ["b16", "b32"]
    assert rows[("ddtree-b16-k4-weak-spine", 4)]["predicted_tok_s"] == pytest.approx(4 * 5.1 / (0.04 + 0.04 / 3))
    assert rows[("ddtree-b16-k4-weak-spine", 4)]["costed_from"] == ["b8", "b32"]
    chain = rows[("ddtree-smine-weak-spine", 1)]
    assert chain["predicted_tok_s"] == pytest.approx(4.1 / 0.04) and chain["costed_from"] == ["DFLASH"]
    assert chain["tok_s_error"] == pytest.approx(4.1 / 0.04 / 110 - 1)
    assert "| ddtree-smine-weak-spine | 4 | b24k2-spine | b16, b32 | 300 | 320 | +6.7% |" in tuning.markdown(result)


@pytest.mark.parametrize("speed, message", [
    ({"speed": [_cell("ddtree-smistyped-real", 50.0)]}, "--schedule-server ddtree-smine-real: no server of the"),
    ({"speed": [_cell("ddtree-smine-real", 0.0)]}, "servers: none"),
    ({"speed": [_cell("ddtree-smine-real", [50])]}, "median_tok_s [50] is not a number"),
])
def test_a_schedule_server_the_tables_do_not_hold_is_one_line_and_exit_2(tmp_path, speed, message):
    proc = _tool(tmp_path, speed)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr


def test_a_schedule_server_of_the_run_that_did_not_start_is_checked_without_verdicts(tmp_path):
    speed = {"servers": [{"name": "ddtree-smine-real", "status": "failed to start"}], "speed": [_cell("dflash", 40.0)]}
    proc = _tool(tmp_path, speed)
    assert proc.returncode == 0, proc.stderr
    assert "| dflash | 1 | 40 |" in proc.stdout


S9 = Path(__file__).resolve().parents[2] / "bench" / "results" / "2026-12-01-wide-weak-schedule-cost-rounds"


def test_session_9s_weak_drafter_check_is_what_the_tool_prints():
    """The weak drafter's costs, measured a run before the tables, sit under them; tune's
    model on the tables' own step times puts the schedule within 10.2 % of what it served."""
    tables = [S9 / run / "e2e-runwide-speed.json" for run in ("wide-speed", "wide-speed-2")]
    result = tuning.check(S9 / "wide-tune" / "tune" / "weak" / "tune.json", tables, "ddtree-stuned-weak-spine")
    assert all(r["tok_s_error"] < 0 for r in result["rows"])
    assert all(abs(r["acceptance_error"]) < 0.03 for r in result["rows"])
    same = {r["concurrency"]: r for r in result["same_table"] if r["server"] == "ddtree-stuned-weak-spine"}
    assert max(abs(r["tok_s_error"]) for r in same.values()) == pytest.approx(0.102, abs=0.001)
    assert (S9 / "tune-check-pooled.md").read_text() == tuning.markdown(result)


def test_the_cost_cells_are_set_against_the_tables_cells_of_the_same_servers():
    """tune's costs (the first run) against the pooled tables (the next two runs), as rates."""
    tables = [S9 / run / "e2e-runwide-speed.json" for run in ("wide-speed", "wide-speed-2")]
    result = tuning.check(S9 / "wide-tune" / "tune" / "weak" / "tune.json", tables, "ddtree-stuned-weak-spine")
    rows = {(r["server"], r["concurrency"]): r for r in result["costs_vs_table"]}
    assert len(rows) == 12, "DFLASH, b8 and b32 were costed (b16 did not start) at 4 C; b16 has no cost of its own"
    dflash = rows[("dflash-weak", 64)]
    assert dflash["cost_step_ms"] == pytest.approx(72.935, abs=0.001)
    assert dflash["table_step_ms"] == pytest.approx(1000 * 64 * 4.267 / ((4954.9 + 5124.1) / 2), rel=1e-3)
    assert dflash["rate_error"] == pytest.approx(dflash["table_step_ms"] / dflash["cost_step_ms"] - 1)
    assert "Median -12.5% over 12 cells (12 under the table)." in tuning.markdown(result)


def _shifted(tune: dict, factor: float, drop: str | None = None) -> dict:
    """A copy of a tune file whose every predicted rate is `factor` times the original's."""
    out = json.loads(json.dumps(tune))
    out["predictions"] = [row for row in out["predictions"] if row["config"] != drop]
    for row in out["predictions"]:
        for cell in row["predicted"].values():
            cell["tok_s"] *= factor
    return out


def test_a_schedule_served_from_one_tune_is_predicted_by_another(tmp_path):
    """--served: the schedule server serves the first tune's picks; a later tune (on costs measured in
    the table's call) predicts those very configs, whatever it would pick itself."""
    served = S9 / "wide-tune" / "tune" / "weak" / "tune.json"
    later = tmp_path / "later.json"
    later.write_text(json.dumps(_shifted(json.loads(served.read_text()), 1.1)))
    table = S9 / "wide-speed-2" / "e2e-runwide-speed.json"
    alone = tuning.check(served, [table], "ddtree-stuned-weak-spine")
    both = tuning.check(later, [table], "ddtree-stuned-weak-spine", served)
    pick = {(r["server"], r["concurrency"]): r for r in alone["rows"]}
    for row in both["rows"]:
        assert row["predicted_tok_s"] == pytest.approx(1.1 * pick[(row["server"], row["concurrency"])]["predicted_tok_s"])
    assert [r["config"] for r in both["same_table"]] == [r["config"] for r in alone["same_table"]]
    assert both["served"] == {"path": str(served), "schedule": "1:32/2,2:29/2,8:21/2,32:9/2"} and "served" not in alone
    assert "The schedule server served 1:32/2,2:29/2,8:21/2,32:9/2, another tune's choice" in tuning.markdown(both)
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps(_shifted(json.loads(served.read_text()), 1.0, drop="b29k2-spine")))
    proc = subprocess.run([sys.executable, "-m", "proving_ground.tuning", "--tune", str(missing), "--speed", str(table),
                           "--schedule-server", "ddtree-stuned-weak-spine", "--served", str(served)],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "its config at C=4, b29k2-spine, has no prediction in the --tune file" in proc.stderr


S10 = RESULTS.parent / "2026-12-02-wide-weak-costs-inside-table"


def test_session_10s_checks_are_what_the_tool_prints_and_the_tables_reproduce_as_tune_predicts():
    """The weak drafter with costs inside the table: tune's costs (the first run) predict the two tables of the same servers within 10 % in 15
    of 20 pooled cells, while the two tables agree within 10 % in 12 of 20; the costs measured
    inside table 2's run sit around it (median 0) and set no offset."""
    tune = S10 / "wide-tune" / "tune" / "weak" / "tune.json"
    tables = [S10 / "wide-speed" / "e2e-runwide-speed.json", S10 / "wide-speed-costed" / "e2e-runwide-speed-costed.json"]
    pooled = tuning.check(tune, tables, "ddtree-stuned-weak-spine")
    assert sum(abs(r["tok_s_error"]) <= 0.10 for r in pooled["rows"]) == 15
    assert all(abs(r["acceptance_error"]) < 0.03 for r in pooled["rows"])
    assert pooled["tables_agree"]["within"] == 12 and pooled["tables_agree"]["cells"] == 20
    assert min(v["vs_dflash"] for v in pooled["verdicts"]) > 1
    assert (S10 / "tune-check-pooled.md").read_text() == tuning.markdown(pooled)
    costed = tuning.check(S10 / "wide-speed-costed" / "tune" / "weak-table" / "tune.json", tables[1:],
                          "ddtree-stuned-weak-spine", tune)
    errors = sorted(r["rate_error"] for r in costed["costs_vs_table"])
    assert len(errors) == 12 and abs(errors[5] + errors[6]) / 2 < 0.01
    assert (S10 / "tune-check-costed.md").read_text() == tuning.markdown(costed)


def test_a_served_c_no_table_measured_needs_no_prediction_and_bad_files_are_one_line(tmp_path):
    served = json.loads((S9 / "wide-tune" / "tune" / "weak" / "tune.json").read_text())
    served["per_concurrency"].append({"concurrency": 128, "best": {"config": "b99k2-spine", "dflash_chain": False}})
    served_path = tmp_path / "served.json"
    served_path.write_text(json.dumps(served))
    table = S9 / "wide-speed-2" / "e2e-runwide-speed.json"
    tune = S9 / "wide-tune" / "tune" / "weak" / "tune.json"
    result = tuning.check(tune, [table], "ddtree-stuned-weak-spine", served_path)
    assert sorted(r["concurrency"] for r in result["rows"] if r["server"] == "ddtree-stuned-weak-spine") == [1, 4, 16, 64]
    measured_list = json.loads(tune.read_text())
    measured_list["measured"] = []
    bad_tune = tmp_path / "bad-tune.json"
    bad_tune.write_text(json.dumps(measured_list))
    not_tune = tmp_path / "not-tune.json"
    not_tune.write_text(json.dumps({"schema": "k26-ddtree-bench/1", "runs": []}))
    for extra, message in (
            (["--tune", str(tune), "--speed", str(table), "--speed", str(table)], "the same speed table is given twice"),
            (["--tune", str(bad_tune), "--speed", str(table)], "--tune: measured is not an object"),
            (["--tune", str(tune), "--speed", str(table), "--served", str(not_tune)],
             f"--served {not_tune}: not a tune file")):
        proc = subprocess.run([sys.executable, "-m", "proving_ground.tuning", *extra, "--schedule-server",
                               "ddtree-stuned-weak-spine"], capture_output=True, text=True)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and message in proc.stderr, proc.stderr

"""`k26-deploy tune` as a real subprocess: a whole run on a walked trace and a bench sweep file, one on
the committed live bench file, and one line with exit 2 for every kind of bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tune_fixtures import MODEL, bench_run, header, random_table, sweep_runs, walk_records, write_results, write_trace

from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.sglang.common import trace

REPO = Path(__file__).resolve().parents[2]
LIVE = REPO / "bench/results/2026-11-30-tiny-lossless-small-budgets-spine-bench/bench-harness/bench-harness.json"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
D = 7


def tune(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree", "tune", *map(str, args)], capture_output=True,
                          text=True, timeout=600)


def walked_trace(path: Path, **meta) -> Path:
    records = []
    for seed in range(4):
        records += walk_records(random_table(seed, 50, D), TreeShape(8, 4, True), f"request-{seed}")[1]
    return write_trace(path, header(D, **meta), records)


def full_sweep(path: Path) -> Path:
    runs = sweep_runs(budgets=(1, 8, 16, 32, 64)) + [
        bench_run(lambda ctx, c: 0.020 + 0.0001 * c, algorithm="DFLASH"),
        bench_run(lambda ctx, c: 0.018, algorithm="AR"),
    ]
    return write_results(path, runs)


def test_a_whole_run_prints_the_table_and_writes_the_schedule_file_and_the_plot(tmp_path):
    (tmp_path / "plan").mkdir()
    out, plot = tmp_path / "plan" / "schedule.json", tmp_path / "plan" / "tune.png"
    done = tune("--trace", walked_trace(tmp_path / "t.trace"), "--costs", full_sweep(tmp_path / "sweep.json"),
                "--out", out, "--plot", plot)
    assert done.returncode == 0, done.stderr
    assert "tune: replaying" in done.stderr and "tune: acceptance" in done.stderr and "steps in" in done.stderr
    assert "| config | accept | C=1 step ms | C=1 tok/s | C=4 step ms |" in done.stdout
    assert "| DFLASH (chain, b7k1) |" in done.stdout and "| AR (measured) | 1.00 | 18.0 |" in done.stdout
    assert "each command serves that one config at every batch size" in done.stdout
    assert "Schedule: 1:" in done.stdout and "reconfigure --schedule-file FILE" in done.stdout
    assert f"reconfigure --schedule {json.loads(out.read_text())['schedule']} --set speculative.spine=" in done.stdout
    assert "geometric midpoint" in done.stdout, "the bucket rule is stated where the schedule is printed"
    schedule = json.loads(out.read_text())
    assert schedule["schema"] == "k26-ddtree-tune/1" and isinstance(schedule["spine"], bool)
    assert schedule["spine_choice"]["option"] == "both" and set(schedule["spine_choice"]["plans"]) == {"on", "off"}
    starts = [int(bucket.split(":")[0]) for bucket in schedule["schedule"].split(",")]
    assert starts[0] == 1 and starts == sorted(set(starts))
    tokens = [bucket.split(":")[1] for bucket in schedule["schedule"].split(",")]
    assert all(a != b for a, b in zip(tokens, tokens[1:])), "equal neighbours are merged"
    assert tokens == [b["bucket"] for b in schedule["buckets"]]
    for row in schedule["per_concurrency"]:
        c, best = str(row["concurrency"]), row["best"]
        chosen = [p for p in schedule["predictions"] if p["dflash_chain"] or p["spine"] == schedule["spine"]]
        assert best["tok_s"] == max(p["predicted"][c]["tok_s"] for p in chosen if c in p["predicted"])
        assert best["tok_s"] == pytest.approx(int(c) * best["acceptance"] / (best["step_ms"] / 1000))
        assert row["runner_up"]["tok_s"] <= best["tok_s"]
        if not best["dflash_chain"]:
            assert f"--budget {best['budget']} --topk {best['topk']}" in row["reconfigure"]
        assert f"  C={c}: {best['config']} {best['tok_s']:.1f} tok/s" in done.stdout
    provenance = schedule["provenance"]
    assert provenance["trace"]["header"]["model"] == MODEL and provenance["trace"]["steps"] > 50
    assert len(schedule["acceptance"]) == 910 and provenance["search"]["concurrency"] == [1, 4, 16, 64]
    assert "not served or measured" in provenance["predicted"]
    data = plot.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_the_committed_live_bench_file_costs_budget_8_and_the_dflash_chain(tmp_path):
    path = walked_trace(tmp_path / "t.trace", model="/tmp/k26/models/target")
    out = tmp_path / "s.json"
    done = tune("--trace", path, "--costs", LIVE, "--min-budget", 8, "--max-budget", 8, "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    schedule = json.loads(out.read_text())
    assert schedule["provenance"]["search"]["concurrency"] == [1, 8]
    assert {p["budget"] for p in schedule["predictions"] if not p["dflash_chain"]} == {8}
    assert any(p["dflash_chain"] for p in schedule["predictions"])
    assert schedule["measured"]["dflash_step_ms"].keys() == {"1", "8"}
    by_default = tune("--trace", path, "--costs", LIVE, "--out", tmp_path / "d.json", "--quiet")
    assert by_default.returncode == 0, by_default.stderr
    search = json.loads((tmp_path / "d.json").read_text())["provenance"]["search"]
    assert (search["min_budget"], search["max_budget"]) == (8, 8), "the default budgets are those the costs measured"
    refused = tune("--trace", path, "--costs", LIVE, "--min-budget", 1, "--out", tmp_path / "r.json")
    assert refused.returncode == 2 and not (tmp_path / "r.json").exists()
    assert refused.stderr.startswith(f"k26-deploy: error: costs missing for budget 1 at C=1: {LIVE} measured budgets 8")


def walked(folder: Path) -> Path:
    return walked_trace(folder / "t.trace")


def not_a_trace(folder: Path) -> Path:
    (folder / "t.trace").write_bytes(b"\x00" * 99)
    return folder / "t.trace"


def not_bench_results(folder: Path) -> Path:
    (folder / "c.json").write_text('{"hello": 1}')
    return folder / "c.json"


def _record(depth: int) -> bytes:
    logprobs = -torch.arange(trace.TOPK, dtype=torch.float32).expand(1, depth, trace.TOPK).contiguous()
    return trace.pack_records([1], [0], [5], torch.zeros(1, depth, trace.TOPK, dtype=torch.long), logprobs, [[5]])


BAD = {
    "missing trace": (lambda t: t / "absent.trace", None, [], "cannot read trace"),
    "empty trace": (lambda t: write_trace(t / "t.trace", header(D), []), None, [], "holds no decode steps"),
    "truncated trace": (lambda t: write_trace(t / "t.trace", header(D), [_record(D), _record(D)[:-3]]), None, [],
                        "is not a whole number of 496-byte records of draft depth 7: 493 bytes are left over"),
    "not a trace": (not_a_trace, None, [], "is not a DDTree trace"),
    "trace of another model than --model": (walked, None, ["--model", "/models/Other"],
                                            f"is a trace of model {MODEL}, not of --model /models/Other"),
    "trace of another model than the sweep": (
        lambda t: walked_trace(t / "t.trace", model="/models/Other"), None, [],
        "is a trace of model /models/Other, but"),
    "trace of another DFlash block": (lambda t: write_trace(t / "t.trace", header(15), [_record(15)]), None, [],
                                      "was traced with DFlash block 16, but"),
    "costs not a bench file": (walked, not_bench_results, [], "is not a k26-deploy bench results file"),
    "costs missing a budget": (walked, lambda t: write_results(t / "c.json", sweep_runs()), ["--min-budget", "1"],
                               "costs missing for budget 1 at C=1"),
    "costs missing a concurrency": (walked, None, ["--concurrency", "1,128"], "costs missing at C=128"),
    "budgets out of range": (walked, None, ["--max-budget", "65"], "need 1 <= --min-budget <= --max-budget <= 64"),
    "not a concurrency list": (walked, None, ["--concurrency", "1,x"], "expected comma-separated integers"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    make_trace, make_costs, extra, message = BAD[case]
    trace_path = make_trace(tmp_path)
    costs_path = make_costs(tmp_path) if make_costs else full_sweep(tmp_path / "sweep.json")
    out = tmp_path / "s.json"
    done = tune("--trace", trace_path, "--costs", costs_path, "--out", out, *extra)
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("k26-deploy: error: ") and message in lines[0], lines[0]
    assert not out.exists() and not out.with_suffix(".png").exists()


def test_help_lists_tune_and_building_the_cli_imports_neither_torch_nor_matplotlib():
    shown = subprocess.run([sys.executable, "-m", "k26_ddtree", "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "tune" in shown.stdout
    assert "--speculative-ddtree-trace" in tune("--help").stdout
    probe = ("import sys; from k26_ddtree.cli.main import build_parser; build_parser(); "
             "print(sorted({'torch', 'matplotlib'} & set(sys.modules)))")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True).stdout.strip() == "[]"


def test_a_choice_closer_than_the_costs_own_spread_is_flagged(tmp_path):
    """Two DFLASH runs 30 % apart: at each C where the best config leads its nearest rival costed
    from another measurement by less than that, tune names the rival and says to bench both. A
    rival of the best's own budget shares its step time and is passed over."""
    runs = sweep_runs(budgets=(1, 8, 16, 32, 64)) + [
        bench_run(lambda ctx, c: 0.020 + 0.0001 * c, algorithm="DFLASH"),
        bench_run(lambda ctx, c: 1.3 * (0.020 + 0.0001 * c), algorithm="DFLASH"),
    ]
    out = tmp_path / "s.json"
    done = tune("--trace", walked_trace(tmp_path / "t.trace"), "--costs", write_results(tmp_path / "c.json", runs),
                "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["per_concurrency"]
    assert all(row["cost_spread"] == pytest.approx(0.3) for row in rows)
    flagged = [row for row in rows if row["within_cost_spread_of"]]
    assert flagged, rows
    for row in flagged:
        best, rival = row["best"], row["within_cost_spread_of"]
        assert rival != best["config"] and not rival.startswith(f"b{best['budget']}k")
        assert f"over {rival}, inside the 30% that repeated cost runs at this C differ by: bench both" in done.stdout


def test_costs_measured_once_per_point_flag_nothing(tmp_path):
    done = tune("--trace", walked_trace(tmp_path / "t.trace"), "--costs", full_sweep(tmp_path / "sweep.json"),
                "--out", tmp_path / "s.json", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "bench both before you keep one" not in done.stdout
    assert all(row["within_cost_spread_of"] is None for row in json.loads((tmp_path / "s.json").read_text())["per_concurrency"])

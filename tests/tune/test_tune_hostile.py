"""`k26-deploy tune` against traces, costs and paths it must refuse in one line (exit 2), and the
file rules of its outputs: never over an input, a device, a FIFO or a folder, never into a folder
that does not exist, and through a symlink to the file it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tune_fixtures import bench_run, header, random_table, sweep_runs, walk_records, write_results, write_trace

from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.sglang.common import trace

D = 7


def tune(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "k26_ddtree", "tune", *map(str, args)], capture_output=True,
                          text=True, timeout=300)


def walked(path: Path, requests: int = 4, vocab_shift: int = 0) -> Path:
    records = []
    for seed in range(requests):
        table = random_table(seed, 50, D)
        if vocab_shift:  # a drafter of another vocabulary: its ids never meet the committed ones
            table = type(table)(table.tokens + vocab_shift, table.logprobs, table.truth, table.roots)
        records += walk_records(table, TreeShape(8, 4, True), f"request-{seed}")[1]
    return write_trace(path, header(D), records)


def costs(path: Path) -> Path:
    runs = sweep_runs(budgets=(1, 8, 16, 32, 64)) + [bench_run(lambda ctx, c: 0.020 + 0.0001 * c, algorithm="DFLASH")]
    return write_results(path, runs)


def one_line_exit_2(done: subprocess.CompletedProcess, message: str) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("k26-deploy: error: ") and message in lines[0], lines[0]


def _records(depth: int, steps: list[tuple[int, int]], committed: list[int]) -> list[bytes]:
    logprobs = -torch.arange(trace.TOPK, dtype=torch.float32).expand(1, depth, trace.TOPK).contiguous()
    tokens = torch.arange(trace.TOPK).expand(1, depth, trace.TOPK).contiguous()
    return [trace.pack_records([request], [step], [5], tokens, logprobs, [committed]) for request, step in steps]


def _header_line(tmp_path: Path, depth) -> Path:
    path = tmp_path / "t.trace"
    path.write_bytes(trace.MAGIC + (json.dumps({**header(D), "depth": depth}) + "\n").encode() + b"\0" * 496)
    return path


TRACES = {
    "header depth -1": (lambda t: _header_line(t, -1), "the trace header's depth -1 is not a draft depth 1..63"),
    "header depth 10**12": (lambda t: _header_line(t, 10**12), "is not a draft depth 1..63"),
    "header depth true": (lambda t: _header_line(t, True), "is not a draft depth 1..63"),
    "garbage lines after the records": (
        lambda t: Path(str(walked(t / "t.trace"))).open("ab").write(b"hello\nworld\n") and t / "t.trace",
        "is not a whole number of 496-byte records of draft depth 7: 12 bytes are left over"),
    "every record commits -1": (lambda t: write_trace(t / "t.trace", header(D), _records(D, [(1, 0), (1, 1)], [-1])),
                                "2 of 2 steps commit no token"),
    "every step is 0": (lambda t: write_trace(t / "t.trace", header(D), _records(D, [(1, 0)] * 3, [0, 1])),
                        "2 records repeat the request and decode step of another"),
    "another vocabulary": (lambda t: walked(t / "t.trace", vocab_shift=1000),
                           "is not a trace of the served model: its drafter's first choice at depth 1 is the token "
                           "the step committed in 0.0% of"),
}


@pytest.mark.parametrize("case", list(TRACES))
def test_a_trace_tune_cannot_plan_from_is_one_line(tmp_path, case):
    make, message = TRACES[case]
    done = tune("--trace", make(tmp_path), "--costs", costs(tmp_path / "c.json"), "--out", tmp_path / "s.json")
    one_line_exit_2(done, message)
    assert not (tmp_path / "s.json").exists()


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _link(path: Path, target: str) -> Path:
    path.symlink_to(target)
    return path


INPUTS = {
    "trace linked to /dev/zero": ("--trace", lambda t: _link(t / "z.trace", "/dev/zero"),
                                  "is not a regular file (a character device)"),
    "trace is a FIFO": ("--trace", lambda t: _fifo(t / "f.trace"), "is not a regular file (a FIFO)"),
    "costs linked to /dev/zero": ("--costs", lambda t: _link(t / "z.json", "/dev/zero"),
                                  "is not a regular file (a character device)"),
    "costs is a FIFO": ("--costs", lambda t: _fifo(t / "f.json"), "is not a regular file (a FIFO)"),
}


@pytest.mark.parametrize("case", list(INPUTS))
def test_an_input_that_is_no_regular_file_is_refused_without_reading_it(tmp_path, case):
    flag, make, message = INPUTS[case]
    given = {"--trace": walked(tmp_path / "t.trace"), "--costs": costs(tmp_path / "c.json")}
    given[flag] = make(tmp_path)
    done = tune("--trace", given["--trace"], "--costs", given["--costs"], "--out", tmp_path / "s.json")
    one_line_exit_2(done, message)


OUTPUTS = {
    "--out over the trace": (lambda t, tr, c: ["--out", tr], "which this command reads"),
    "--plot over the costs": (lambda t, tr, c: ["--plot", c], "which this command reads"),
    "--out and --plot one file": (lambda t, tr, c: ["--out", t / "x.json", "--plot", t / "x.json"],
                                  "name the same file"),
    "--out in a missing folder": (lambda t, tr, c: ["--out", t / "absent" / "x.json"], "does not exist (create it"),
    "--out a FIFO": (lambda t, tr, c: ["--out", _fifo(t / "fifo")], "is a FIFO; give the path of a file"),
    "--out a folder": (lambda t, tr, c: ["--out", t], "is a folder; give the path of a file"),
    "--out a link to the trace": (lambda t, tr, c: ["--out", _link(t / "l.json", str(tr))], "which this command reads"),
}


@pytest.mark.parametrize("case", list(OUTPUTS))
def test_an_output_path_that_would_replace_something_else_is_refused(tmp_path, case):
    trace_path, costs_path = walked(tmp_path / "t.trace"), costs(tmp_path / "c.json")
    before = {p: p.read_bytes() for p in (trace_path, costs_path)}
    extra = OUTPUTS[case][0](tmp_path, trace_path, costs_path)
    if "--out" not in extra:
        extra += ["--out", tmp_path / "s.json"]
    done = tune("--trace", trace_path, "--costs", costs_path, *extra)
    one_line_exit_2(done, OUTPUTS[case][1])
    assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "absent").exists()


def test_an_output_given_as_a_symlink_is_written_through_it(tmp_path):
    target = tmp_path / "plans" / "schedule.json"
    target.parent.mkdir()
    link = _link(tmp_path / "latest.json", str(target))
    done = tune("--trace", walked(tmp_path / "t.trace"), "--costs", costs(tmp_path / "c.json"), "--out", link,
                "--plot", tmp_path / "p.png", "--quiet")
    assert done.returncode == 0, done.stderr
    assert link.is_symlink() and json.loads(target.read_text())["schema"] == "k26-ddtree-tune/1"


def test_a_device_is_refused_as_an_output_before_anything_is_written():
    from k26_ddtree.errors import UserError
    from k26_ddtree.paths import output_target

    with pytest.raises(UserError, match="is a character device"):
        output_target(Path("/dev/null"), "--out")


def test_a_trace_of_one_request_says_it_cannot_separate_the_choices(tmp_path):
    out = tmp_path / "s.json"
    done = tune("--trace", walked(tmp_path / "t.trace", requests=1), "--costs", costs(tmp_path / "c.json"),
                "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    assert "the trace holds one request: too small to separate them" in done.stdout
    rows = json.loads(out.read_text())["per_concurrency"]
    assert all(row["lead_over_runner_up"]["separated"] is False for row in rows)


def test_every_choice_gets_an_interval_of_its_lead_from_resampled_requests(tmp_path):
    out = tmp_path / "s.json"
    done = tune("--trace", walked(tmp_path / "t.trace", requests=12), "--costs", costs(tmp_path / "c.json"),
                "--out", out, "--quiet")
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["per_concurrency"]
    for row in rows:
        lead = row["lead_over_runner_up"]
        assert lead["low"] <= lead["lead"] <= lead["high"] and lead["level"] == 0.95
        assert "resampling the trace's 12 requests" in done.stdout


def test_a_schedule_of_chains_only_is_printed_as_dflash_not_as_a_schedule_reconfigure_refuses(tmp_path):
    # DFLASH far cheaper than any tree: the chain wins at every C.
    runs = sweep_runs(budgets=(1, 8, 16, 32, 64)) + [bench_run(lambda ctx, c: 0.001, algorithm="DFLASH")]
    done = tune("--trace", walked(tmp_path / "t.trace"), "--costs", write_results(tmp_path / "c.json", runs),
                "--out", tmp_path / "s.json", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "Schedule: 1:0" not in done.stdout
    assert "Schedule: none: the plain DFlash chain is best at every C" in done.stdout

"""`bench report` and `bench sweep` end to end against the stand-in."""

from __future__ import annotations

import json
import shlex
import sys

from k26_ddtree.cli.main import main

SMALL = ["--contexts", "16,64", "--concurrency", "1,4", "--output-len", "16", "--warmup", "1", "--quiet"]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_report_side_by_side(standin, tmp_path, capsys):
    dflash = standin(env={"STANDIN_ACCEPT": "2.0"}, args=["--speculative-algorithm", "DFLASH"])
    ddtree = standin(env={"STANDIN_ACCEPT": "4.0"},
                     args=["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "16"])
    first, second = tmp_path / "dflash.json", tmp_path / "ddtree.json"
    assert main(["bench", "--url", dflash.url, "--out", str(first), *SMALL]) == 0
    assert main(["bench", "--url", ddtree.url, "--out", str(second), *SMALL]) == 0
    out = tmp_path / "report"
    assert main(["bench", "report", str(first), str(second), "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed[0].endswith("report.md")
    for name in ("throughput.png", "acceptance.png", "single_stream.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 10_000, name
    report = (out / "report.md").read_text()
    assert "| ctx | C | DFLASH | DDTREE b16 |" in report
    assert "Best config per concurrency" in report
    assert "![throughput](throughput.png)" in report
    assert "| 16 | 1 | 8/8 |" in report
    assert "4.00 | 4.00 |" in report and "2.00 | 2.00 |" in report


def test_report_marks_errors_and_rejects_bad_input(standin, tmp_path, capsys):
    server = standin(env={"STANDIN_ERROR_EVERY": "2"})
    results = tmp_path / "errors.json"
    assert main(["bench", "--url", server.url, "--out", str(results), "--contexts", "16", "--concurrency", "1",
                 "--output-len", "8", "--warmup", "0", "--quiet"]) == 1
    out = tmp_path / "r"
    assert main(["bench", "report", str(results), "--out", str(out)]) == 0
    assert "ERRORS 4" in (out / "report.md").read_text()
    not_results = tmp_path / "other.json"
    not_results.write_text(json.dumps({"hello": 1}))
    assert main(["bench", "report", str(not_results)]) == 2
    assert main(["bench", "report", str(tmp_path / "missing.json")]) == 2
    err = capsys.readouterr().err
    assert "not a k26-deploy bench results file" in err and "cannot read" in err


def test_sweep_runs_reconfigure_per_config_and_picks_winners(standin, tmp_path, capsys):
    server = standin(args=["--speculative-algorithm", "DDTREE"])
    calls = tmp_path / "calls.log"
    fake = (
        "import sys; b, k = sys.argv[1], sys.argv[2]; open(sys.argv[3], 'a').write('%s %s\\n' % (b, k)); "
        "sys.exit(3 if (b, k) == ('8', '8') else 0)"
    )
    template = f"{{python}} -c {shlex.quote(fake)} {{budget}} {{topk}} {shlex.quote(str(calls))}"
    out = tmp_path / "sweep.json"
    code = main(["bench", "sweep", "--budget", "4,8", "--topk", "4,8", "--reconfigure-cmd", template,
                 "--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1,4",
                 "--output-len", "8", "--warmup", "0", "--quiet"])
    assert code == 1  # one reconfigure failed
    assert calls.read_text().split("\n")[:-1] == ["4 4", "4 8", "8 4", "8 8"]
    runs = json.loads(out.read_text())["runs"]
    assert [(r["budget"], r["topk"], r["label"]) for r in runs] == [
        (4, 4, "DDTREE b4 k4"), (4, 8, "DDTREE b4 k8"), (8, 4, "DDTREE b8 k4")]
    summary = out.with_suffix(".sweep.md").read_text()
    assert "Best config per concurrency" in summary
    assert "budget 8 topk 8: reconfigure exited 3" in summary
    captured = capsys.readouterr()
    assert summary in captured.out
    assert f"sweep: 3 run(s) recorded in {out}; summary in {out.with_suffix('.sweep.md')}" in captured.err
    rows = [line for line in summary.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")]
    assert len(rows) == 2 and all("DDTREE b" in row for row in rows)


def test_a_sweep_where_no_config_finished_says_nothing_was_written(tmp_path, capsys):
    out = tmp_path / "sw.json"
    summary = out.with_suffix(".sweep.md")
    code = main(["bench", "sweep", "--budget", "4,8", "--topk", "4", "--reconfigure-cmd", "{python} -c 'exit(3)'",
                 "--url", "http://127.0.0.1:9", "--out", str(out), "--contexts", "16", "--concurrency", "1",
                 "--quiet"])
    captured = capsys.readouterr()
    assert code == 1 and not out.exists() and not summary.exists()
    assert captured.err.endswith(f"sweep: no run recorded, nothing written (neither {out} nor {summary})\n")
    assert "results in" not in captured.err
    assert "budget 8 topk 4: reconfigure exited 3" in captured.out, "the failures are still shown"
    summary.write_text("an earlier sweep's summary\n")
    assert main(["bench", "sweep", "--budget", "8", "--topk", "4", "--reconfigure-cmd", "false",
                 "--url", "http://127.0.0.1:9", "--out", str(out), "--quiet"]) == 1
    assert summary.read_text() == "an earlier sweep's summary\n"


def test_sweep_default_command_uses_this_interpreter():
    from k26_ddtree.bench.cli import DEFAULT_RECONFIGURE
    from k26_ddtree.bench.sweep import SweepPlan

    argv = SweepPlan((8,), (4,), DEFAULT_RECONFIGURE, 10).command(8, 4)
    assert argv == [sys.executable, "-m", "k26_ddtree", "reconfigure", "--budget", "8", "--topk", "4"]


def test_a_ddtree_server_is_labelled_ddtree_though_it_reports_dflash():
    from k26_ddtree.bench.results import algorithm_of, run_label

    info = {"speculative_algorithm": "DFLASH", "speculative_ddtree_budget": 8, "speculative_ddtree_topk": 4}
    assert algorithm_of(info) == "DDTREE"
    assert run_label(info, 8, 4) == "DDTREE b8 k4"
    scheduled = {"speculative_algorithm": "DFLASH", "speculative_ddtree_budget_schedule": "1:16/4,8:0"}
    assert algorithm_of(scheduled) == "DDTREE" and run_label(scheduled, None, None) == "DDTREE schedule 1:16/4,8:0"
    assert algorithm_of({"speculative_algorithm": "DFLASH"}) == "DFLASH"
    assert algorithm_of({"speculative_algorithm": None}) == "AR"


def test_report_refuses_runs_it_cannot_read_and_a_file_as_out_folder(tmp_path, capsys):
    shapes = {
        "not-utf8.json": b"\xff\xfe",
        "run-not-object.json": json.dumps({"schema": "k26-ddtree-bench/1", "runs": [5]}).encode(),
        "run-without-cells.json": json.dumps({"schema": "k26-ddtree-bench/1", "runs": [{"label": "x"}]}).encode(),
    }
    for name, data in shapes.items():
        (tmp_path / name).write_bytes(data)
        assert main(["bench", "report", str(tmp_path / name), "--out", str(tmp_path / f"{name}.report")]) == 2, name
        assert not (tmp_path / f"{name}.report").exists(), "no report folder for input it refused"
    a_file = tmp_path / "a-file"
    a_file.write_text("x\n")
    good = {"run_id": "r", "label": "AR", "status": "complete", "started_at": "t", "cells": []}
    (tmp_path / "good.json").write_text(json.dumps({"schema": "k26-ddtree-bench/1", "runs": [good]}))
    assert main(["bench", "report", str(tmp_path / "good.json"), "--out", str(a_file)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("k26-deploy: error: ") for line in err), err
    assert "not JSON (not UTF-8 text)" in err[0] and "run 1 is not an object" in err[1]
    assert "run 1 lacks run_id, status, started_at, cells" in err[2]
    assert "cannot create the report folder" in err[3]

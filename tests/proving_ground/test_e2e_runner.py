"""The GPU runner's mechanics against the stand-in sglang (tests/standin as the site): launches,
readiness, the AR reference and oracle file, the second start wave for -oracle servers, verdicts
and the report, speed runs, and servers kept for (and reused by) a later run."""

import datetime
import json
import re
import shutil
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STANDIN = REPO / "tests" / "standin"
ENTRY = REPO / "proving_ground" / "device" / "e2e.py"
# Load at once, ready half a second later; acceptance 3.2 is 10 verify steps for 32 new tokens.
STANDIN_ENV = {"STANDIN_LOAD_SECONDS": "0", "STANDIN_WARMUP_SECONDS": "0.5", "STANDIN_ACCEPT": "3.2"}


def free_base_port(count: int) -> int:
    for base in range(34000 + os.getpid() % 2000 * 8, 60000, 97):
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                s.bind(("127.0.0.1", port))
                socks.append(s)
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free port range")


@pytest.fixture
def setup(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    prompts = [{"text": f"p{i}", "input_ids": [3 + i, 40 + i, 7]} for i in range(8)]
    (models / "prompts.json").write_text(json.dumps({"seed": 0, "prompts": prompts}))
    matrix = tmp_path / "matrix.json"
    matrix.write_text(json.dumps({
        "prompts": 8, "new_tokens": 32, "eps": 0.05,
        "server": {"mem_fraction_static": 0.05, "max_total_tokens": 4096, "launch_stagger_s": 0.1,
                   "context_length": 256, "max_running_requests": 16, "cuda_graph_bs": [1, 16],
                   "ready_timeout_s": 60},
        "workloads": {"greedy-c1": {"temperature": 0.0, "concurrency": 1},
                      "greedy-c16": {"temperature": 0.0, "concurrency": 16},
                      "sample-c16": {"temperature": 0.7, "top_p": 0.95, "concurrency": 16}},
        "spec_workloads": ["greedy-c1", "greedy-c16", "sample-c16"], "ar_workloads": ["greedy-c1", "greedy-c16"],
        "runs": {"t": ["ar", "dflash-eager", "ddtree-b8-k4-real", "ddtree-b8-k4-oracle"]}}))
    return tmp_path, models, matrix


def run_e2e(tmp_path, models, matrix, env_extra, *extra, run="t"):
    env = dict(os.environ, PYTHONPATH=str(REPO), **{**STANDIN_ENV, **env_extra})
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", run,
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), "--jit-dir", str(tmp_path / "jit"), "--python", sys.executable,
           "--base-port", str(free_base_port(4)), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=240)
    report = json.loads((tmp_path / "out" / f"e2e-run{run}.json").read_text())
    return done, report


def test_ties_only_pass_and_oracle_servers_start_after_the_reference(setup):
    tmp_path, models, matrix = setup
    done, report = run_e2e(tmp_path, models, matrix, {"STANDIN_DIVERGE_AT": "5", "STANDIN_TIE_GAP": "0.01"},
                           "--patched-site", str(STANDIN))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert report["overall"] == "PASS"
    by_name = {s["name"]: s for s in report["servers"]}
    assert [c["verdict"] for c in by_name["ar"]["cells"]] == ["reference", "exact"]
    oracle_cells = by_name["ddtree-b8-k4-oracle"]["cells"]
    assert [c["verdict"] for c in oracle_cells] == ["lossless (ties only)"] * 2 + ["completed"]
    assert oracle_cells[0]["divergences"][0]["position"] == 5
    assert oracle_cells[0]["accept_length"] == pytest.approx(32 / 10)
    assert by_name["dflash-eager"]["capture_s"] == 1.5
    oracle = json.loads((tmp_path / "out" / "oracle-runt.json").read_text())
    assert len(oracle["prompts"]) == 8 and len(oracle["prompts"][0]["ar_output_ids"]) == 32
    oracle_log = (tmp_path / "work" / "logs" / "ddtree-b8-k4-oracle.log").read_text()
    assert "--speculative-ddtree-budget 8" in oracle_log
    assert "Overall: **PASS**" in (tmp_path / "out" / "e2e-runt.md").read_text()
    assert (tmp_path / "out" / "logs-runt.tar.xz").is_file()


def test_a_divergence_where_the_reference_is_decisive_fails(setup):
    tmp_path, models, matrix = setup
    done, report = run_e2e(tmp_path, models, matrix, {"STANDIN_DIVERGE_AT": "9"}, "--patched-site", str(STANDIN))
    assert done.returncode == 1
    assert report["overall"].startswith("FAIL")
    div = report["servers"][1]["cells"][0]["divergences"][0]
    assert div["position"] == 9 and div["gap"] == pytest.approx(3.0) and not div["tie"]


def test_ddtree_servers_are_skipped_when_the_patch_set_cannot_apply(setup):
    tmp_path, models, matrix = setup
    done, report = run_e2e(tmp_path, models, matrix, {})
    assert done.returncode == 1
    assert report["overall"].startswith("INCOMPLETE")
    skipped = [s["name"] for s in report["servers"] if s["status"].startswith("skipped")]
    assert skipped == ["ddtree-b8-k4-real", "ddtree-b8-k4-oracle"]


def test_the_report_is_written_by_the_deadline_when_servers_never_become_ready(setup):
    tmp_path, models, matrix = setup
    done, report = run_e2e(tmp_path, models, matrix, {"STANDIN_FAIL": "health"}, "--patched-site", str(STANDIN),
                           "--deadline-s", "25")
    assert done.returncode == 1
    assert report["wall_s"] < 90
    status = {s["name"]: s["status"] for s in report["servers"]}
    assert status.pop("ddtree-b8-k4-oracle") == "skipped: no AR reference for the oracle file"
    assert all(v.startswith("failed to start (timeout") for v in status.values())


def test_a_server_crowded_out_of_memory_by_its_wave_is_started_again_alone(setup):
    tmp_path, models, matrix = setup
    marker = tmp_path / "first-start-fails"
    done, report = run_e2e(tmp_path, models, matrix, {"STANDIN_FAIL": f"memory-once:{marker}"},
                           "--patched-site", str(STANDIN))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert report["overall"] == "PASS"
    crowded = list((tmp_path / "work" / "logs").glob("*.crowded.log"))
    assert len(crowded) == 1 and "Not enough memory" in crowded[0].read_text()
    name = crowded[0].name.removesuffix(".crowded.log")
    assert f"{name} found too little free GPU memory, possibly because others of its wave loaded" in done.stdout
    retried = {s["name"]: s for s in report["servers"]}[name]
    assert retried["retried_alone"] and sum(s["retried_alone"] for s in report["servers"]) == 1
    assert retried["cells"] and all(c["verdict"] in ("reference", "exact") for c in retried["cells"]), retried


def test_log_parsing(tmp_path):
    from proving_ground.e2e import report

    log = tmp_path / "s.log"
    log.write_text("Capture cuda graph end. Time elapsed: 38.50 s. mem usage=0.1 GB\n"
                   "Capture draft cuda graph end. Time elapsed: 12.25 s. mem usage=0.1 GB\n"
                   "Can not initialize OpenAIServingResponses, error: Traceback (most recent call last):\n"
                   "RuntimeError: CUDA error: an illegal memory access was encountered\n")
    assert report.capture_seconds(log) == 50.8
    assert report.fatal_lines(log) == ["RuntimeError: CUDA error: an illegal memory access was encountered"]


def speed_matrix(tmp_path, matrix):
    spec = json.loads(matrix.read_text())
    spec["speed_runs"] = ["s"]
    spec["speed"] = {"repeats": 3, "min_seconds": 0.3,
                     "cells": {"greedy-c1": {"temperature": 0.0, "concurrency": 1},
                               "greedy-c4": {"temperature": 0.0, "concurrency": 4},
                               "sample-c4": {"temperature": 0.7, "top_p": 0.95, "concurrency": 4}}}
    spec["first_wave"] = ["ar"]
    spec["last_wave"] = ["ddtree-b8-k4-weak"]
    spec["runs"]["s"] = ["ar", "dflash", "ddtree-b8-k4-weak"]
    spec["runs"]["keeper"] = ["ar", "dflash"]
    path = tmp_path / "speed-matrix.json"
    path.write_text(json.dumps(spec))
    return path


def test_a_speed_run_repeats_each_cell_long_enough_and_checks_every_greedy_output(setup):
    tmp_path, models, matrix = setup
    env = {"STANDIN_DIVERGE_AT": "5", "STANDIN_TIE_GAP": "0.01"}
    done, report = run_e2e(tmp_path, models, speed_matrix(tmp_path, matrix), env, "--patched-site", str(STANDIN),
                           run="s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert report["overall"] == "PASS"
    launches = [line.split("launched ", 1)[1] for line in done.stdout.splitlines() if "] launched " in line]
    assert launches == ["ar", "dflash", "ddtree-b8-k4-weak"], "first wave, the rest, then the last wave"
    cells = {(c["server"], c["cell"]): c for c in report["speed"]}
    assert len(cells) == 9
    for (server, cell), c in cells.items():
        assert c["repeats"] == 3 and c["errors"] == 0
        assert all(s >= 0.3 for s in c["repeat_seconds"]), c
        assert c["min_tok_s"] <= c["median_tok_s"] <= c["max_tok_s"]
        assert len(c["repeat_tok_s"]) == 3 and sorted(c["repeat_tok_s"])[1] == c["median_tok_s"]
        assert c["repeat_started"] == sorted(c["repeat_started"]) and c["repeat_started"][0] > 1e9
        busy, steal = c["repeat_cpu_busy"], c["repeat_cpu_steal"]
        assert len(busy) == len(steal) == 3 and all(0 < b <= 1 and 0 <= t <= 1 for b, t in zip(busy, steal)), c
        concurrency = int(cell.rsplit("c", 1)[1])
        assert all(n >= concurrency for n in c["repeat_requests"]), "every slot took a request"
        assert all(0 <= cut <= concurrency for cut in c["repeat_cut"]) and c["repeat_late"] == [0, 0, 0], c
        latency = c["latency"]
        assert latency["requests"] == max(2, concurrency) and latency["errors"] == 0
        assert latency["decode_tok_per_s"] >= latency["tok_per_s"] > 0, "the waits for a first token left out"
        assert latency["ttft_ms"]["p50"] > 0 and latency["itl_ms"]["p99"] >= latency["itl_ms"]["p50"] > 0, latency
        if cell.startswith("greedy"):
            expected = "exact" if server == "ar" else "lossless (ties only)"
            assert c["verdict"] == expected and (server == "ar" or c["divergences"][0]["position"] == 5)
        else:
            assert c["verdict"] == "completed"
    # the stand-in's 3.2 a step, but an aborted request's last step commits only whole tokens
    assert cells[("dflash", "greedy-c1")]["accept_length"] == pytest.approx(32 / 10, rel=0.05)
    assert cells[("ar", "greedy-c1")]["accept_length"] is None
    table = (tmp_path / "out" / "speed-runs.md").read_text()
    assert "| ddtree-b8-k4-weak |" in table and "xdflash" in table
    assert re.search(r"\| ddtree-b8-k4-weak \| \d\.\d\d \[\d\.\d\d-\d\.\d\d\] \|", table), "ratios carry intervals"
    weak_log = (tmp_path / "work" / "logs" / "ddtree-b8-k4-weak.log").read_text()
    assert "/m/drafter-weak" not in weak_log and "drafter-weak" in weak_log and "--sleep-on-idle" in weak_log


def test_servers_kept_for_a_later_run_are_reused_when_code_and_models_match(setup):
    tmp_path, models, matrix = setup
    speed = speed_matrix(tmp_path, matrix)
    done, first = run_e2e(tmp_path, models, speed, {}, "--patched-site", str(STANDIN), "--keep-for", "keeper", run="keeper")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    status = {s["name"]: s for s in first["servers"]}
    assert status["ar"]["status"] == status["dflash"]["status"] == "kept running"
    try:
        done, again = run_e2e(tmp_path, models, speed, {}, "--patched-site", str(STANDIN), run="keeper")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        for s in again["servers"]:
            assert s["reused"] and s["port"] == status[s["name"]]["port"], s
            assert s["status"] == "stopped"
        # stopped now, so a third run starts its own
        done, third = run_e2e(tmp_path, models, speed, {}, "--patched-site", str(STANDIN), run="keeper")
        assert not any(s["reused"] for s in third["servers"])
    finally:
        state = json.loads((tmp_path / "work" / "servers.json").read_text())
        for kept in state["servers"].values():
            try:
                os.killpg(kept["pid"], 9)
            except ProcessLookupError:
                pass


def test_servers_a_killed_run_left_behind_are_stopped_by_the_next(setup):
    """A run killed before its end (SIGKILL: no finish) still recorded its servers at launch; the
    next run stops them rather than leave them holding the GPU and their ports."""
    tmp_path, models, matrix = setup
    speed = speed_matrix(tmp_path, matrix)
    env = dict(os.environ, PYTHONPATH=str(REPO), **STANDIN_ENV)
    cmd = [sys.executable, str(ENTRY), "--matrix", str(speed), "--run", "keeper",
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), "--jit-dir", str(tmp_path / "jit"), "--python", sys.executable,
           "--base-port", str(free_base_port(4)), "--patched-site", str(STANDIN)]
    runner = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    state = tmp_path / "work" / "servers.json"
    deadline = time.time() + 60
    while time.time() < deadline and not (state.is_file() and len(json.loads(state.read_text())["servers"]) == 2):
        time.sleep(0.2)
    runner.kill()
    runner.wait(timeout=30)
    left = json.loads(state.read_text())["servers"]
    pids = [entry["pid"] for entry in left.values()]
    assert all(not entry["keep"] for entry in left.values()) and all(_alive(pid) for pid in pids)
    done, report = run_e2e(tmp_path, models, speed, {}, "--patched-site", str(STANDIN), run="keeper")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "left by a killed run" in done.stdout
    assert not any(_alive(pid) for pid in pids)
    assert not any(s["reused"] for s in report["servers"])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


@pytest.mark.parametrize("extra, message", [
    (["--keep-for", "nope"], "--keep-for nope: no such run"),
    (["--oracle-file", "/nonexistent/oracle.json"], "--oracle-file /nonexistent/oracle.json: no such file"),
])
def test_runner_mistakes_are_one_line_and_exit_2(setup, extra, message):
    tmp_path, models, matrix = setup
    env = dict(os.environ, PYTHONPATH=str(REPO), **STANDIN_ENV)
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", "t",
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"), *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    (models / "prompts.json").unlink()
    done = subprocess.run(cmd[:-len(extra)], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and "prompts.json is missing" in done.stderr and "Traceback" not in done.stderr


def test_a_schedule_server_runs_ramp_cells_and_the_tune_phase_packs_its_costs(setup):
    """ddtree-s<NAME>: the schedule from --schedule @FILE (tune's format) reaches the server's command
    line; a ramp asks each request for fewer tokens and is judged on its prefix; each matrix "tunes"
    group's trace server gets its own trace file, its cost servers are benched with the users'
    harness, and without a trace (the stand-in writes none) its tune is not run, said so, and the
    costs of every group still come back packed in one file."""
    import tarfile

    tmp_path, models, matrix = setup
    spec = json.loads(matrix.read_text())
    spec["workloads"]["greedy-ramp"] = {"temperature": 0.0, "concurrency": 16, "ramp": True}
    spec["runs"]["sched"] = ["ar", "ddtree-stuned-real-spine", "ddtree-b8-k4-real"]
    spec["run_workloads"] = {"sched": {"ddtree-stuned-real-spine": ["greedy-c1", "greedy-ramp"],
                                       "ddtree-b8-k4-real": ["greedy-c1"]}}
    spec["tunes"] = {"sched": {"one": {"trace": "ddtree-stuned-real-spine",
                                       "costs": ["ddtree-stuned-real-spine", "ddtree-b8-k4-real"]},
                               "two": {"trace": "ddtree-b8-k4-real", "costs": ["ddtree-b8-k4-real"],
                                       "args": ["--spine=off"]}}}
    matrix.write_text(json.dumps(spec))
    tuned = tmp_path / "tune.json"
    tuned.write_text(json.dumps({"schema": "k26-ddtree-tune/1", "schedule": "1:8/4,4:0", "spine": True}))
    (models / "target").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"vocab_size": 2048}))  # bench reads it
    # An nvidia-smi that notes when it is started, and with what.
    smi_bin, smi_log = tmp_path / "bin", tmp_path / "smi.log"
    smi_bin.mkdir()
    (smi_bin / "nvidia-smi").write_text('#!/bin/sh\necho "$(date +%s.%N) $*" >> "$SMI_LOG"\n')
    (smi_bin / "nvidia-smi").chmod(0o755)
    done, report = run_e2e(tmp_path, models, matrix, {"PATH": f"{smi_bin}:{os.environ['PATH']}", "SMI_LOG": str(smi_log)},
                           "--patched-site", str(STANDIN), "--schedule", f"tuned=@{tuned}", "--cost-seconds", "0.2",
                           run="sched")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    by_name = {s["name"]: s for s in report["servers"]}
    cells = by_name["ddtree-stuned-real-spine"]["cells"]
    assert [(c["workload"], c["verdict"]) for c in cells] == [("greedy-c1", "exact"), ("greedy-ramp", "exact")]
    assert cells[1]["tokens"] == sum(max(1, 32 * (i + 1) // 16) for i in range(16))
    log = (tmp_path / "work" / "logs" / "ddtree-stuned-real-spine.log").read_text()
    assert "--speculative-ddtree-budget-schedule 1:8/4,4:0" in log and "--speculative-ddtree-spine" in log
    assert "tune one: no trace; not run" in done.stdout and "tune two: no trace; not run" in done.stdout
    with tarfile.open(tmp_path / "out" / "tune.tar.xz") as archive:
        s8, b8 = "ddtree-stuned-real-spine", "ddtree-b8-k4-real"
        for group, order in (("one", [s8, b8, b8, s8, s8, b8]), ("two", [b8, b8, b8])):
            costs = json.load(archive.extractfile(f"tune/{group}/costs.json"))
            # Three rounds (--cost-repeats' default) across the group's cost servers, the order
            # rotated each round, one closed loop per server and C each.
            assert [run["label"] for run in costs["runs"]] == order
            for run in costs["runs"]:
                assert [c["concurrency"] for c in run["cells"]] == [1, 4, 16, 64]
                # The costs' closed loop: the run's own prompts and tokens per request.
                assert run["settings"]["prompts"]["kind"] == "prompt-set"
                assert run["settings"]["matrix"]["output_len"] == 32
                assert all(len(c["steady"]["repeats"]) == 1 for c in run["cells"])
    assert "tune one costs, round 2/3 ddtree-b8-k4-real: exit 0" in done.stdout
    # The sampler ran while the servers served their cells, and stopped before the costs: none of
    # its calls started after the first cost run's second, in a cost phase of several of its periods.
    calls = [float(line.split()[0]) for line in smi_log.read_text().splitlines()
             if "--query-compute-apps" in line or "--query-gpu=memory.used" in line]
    with tarfile.open(tmp_path / "out" / "tune.tar.xz") as archive:
        runs = [run for group in ("one", "two") for run in json.load(archive.extractfile(f"tune/{group}/costs.json"))["runs"]]
    stamps = [datetime.datetime.strptime(run[key], "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=datetime.timezone.utc).timestamp()
              for run in runs for key in ("started_at", "finished_at")]
    assert calls and max(stamps) - min(stamps) > 6, (calls, stamps)
    assert max(calls) < min(stamps) + 1, (calls, min(stamps))
    assert not (tmp_path / "out" / "tune").exists()


def test_a_tune_file_that_chose_the_chain_everywhere_starts_no_schedule_server(setup):
    """Serving a chain-only schedule as DDTree is refused by the server; the run goes on without
    that server and says that its DFLASH server is the tuned config."""
    tmp_path, models, matrix = setup
    spec = json.loads(matrix.read_text())
    spec["runs"]["chain"] = ["ar", "dflash-eager", "ddtree-schain-real-spine"]
    matrix.write_text(json.dumps(spec))
    tuned = tmp_path / "tune.json"
    tuned.write_text(json.dumps({"schema": "k26-ddtree-tune/1", "schedule": "1:0", "spine": True}))
    done, report = run_e2e(tmp_path, models, matrix, {}, "--patched-site", str(STANDIN),
                           "--schedule", f"chain=@{tuned}", run="chain")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert [s["name"] for s in report["servers"]] == ["ar", "dflash-eager"]
    assert "chose the plain chain at every concurrency" in report["not_started"]["ddtree-schain-real-spine"]
    assert "ddtree-schain-real-spine: not started" in done.stdout


@pytest.mark.parametrize("tunes, message", [
    ({"t": {"g": {"trace": "ddtree-b8-k4-real"}}}, "matrix \"tunes\" t/g: expected {\"trace\": SERVER"),
    ({"t": {"g": {"trace": "ddtree-b8-k4-real", "costs": "dflash-eager"}}}, "t/g: expected {\"trace\": SERVER"),
    ({"t": {"../g": {"trace": "ddtree-b8-k4-real", "costs": []}}}, "t/../g: a group name is a lowercase letter"),
    ({"t": {"g": {"trace": "ddtree-b8-k4-real", "costs": ["dflash"]}}}, "dflash is not a server of run t"),
    ({"t": {"g": {"trace": "dflash-eager", "costs": ["dflash-eager"]}}}, "dflash-eager is no DDTree server"),
    ({"t": {"g": {"trace": "ddtree-b8-k4-real", "costs": []}, "h": {"trace": "ddtree-b8-k4-real", "costs": []}}},
     "two groups trace one server"),
    ({"t": {"g": {"trace_from": "weak", "costs": []}}}, "t/g: \"trace_from\" (costs inside the speed table) needs a speed run"),
    ({"t": {"g": {"trace": "ddtree-b8-k4-real", "trace_from": "weak", "costs": []}}}, "t/g: expected {\"trace\": SERVER or"),
    ({"t": {"g": {"trace_from": "../weak", "costs": []}}}, "t/g: expected {\"trace\": SERVER or"),
    ({"t": {"g": {"trace": "", "costs": []}}}, "t/g: expected {\"trace\": SERVER or"),
    ({"t": {"g": {"trace": 5, "trace_from": "weak", "costs": []}}}, "(args optional)"),
])
def test_a_bad_tune_group_is_one_line_and_leaves_no_out(setup, tunes, message):
    tmp_path, models, matrix = setup
    spec = json.loads(matrix.read_text())
    spec["tunes"] = tunes
    matrix.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(REPO), **STANDIN_ENV)
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", "t",
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work")]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("schedule, message", [
    ("tuned", "expected NAME=SCHEDULE or NAME=@FILE"),
    ("Tuned=1:8/4", "NAME is a lowercase letter"),
    ("tuned=@/nonexistent/tuned.json", "does not exist (k26-deploy tune writes one)"),
    ("tuned=1:8/4,,4:0", "server ddtree-stuned-real: schedule '1:8/4,,4:0': '' is not bs:budget/topk"),
])
def test_a_bad_schedule_is_one_line_and_leaves_no_out_or_work(setup, schedule, message):
    tmp_path, models, matrix = setup
    spec = json.loads(matrix.read_text())
    spec["runs"]["s"] = ["ar", "ddtree-stuned-real"]
    matrix.write_text(json.dumps(spec))
    env = dict(os.environ, PYTHONPATH=str(REPO), **STANDIN_ENV)
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", "s",
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), "--schedule", schedule]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()


def test_tune_groups_narrow_to_the_started_servers_and_a_kept_trace_server_starts_anew(setup):
    """--only leaves a group out when its trace server is not started, and benches only the cost
    servers that are; a trace server an earlier run kept is restarted with this run's trace, and
    an earlier run's trace file is never read as this run's."""
    import tarfile

    tmp_path, models, matrix = setup
    spec = json.loads(matrix.read_text())
    spec["runs"]["g"] = ["ar", "dflash-eager", "ddtree-b8-k4-real", "ddtree-b8-k4-oracle"]
    spec["tunes"] = {"g": {"one": {"trace": "ddtree-b8-k4-real", "costs": ["dflash-eager", "ddtree-b8-k4-real"]},
                           "two": {"trace": "ddtree-b8-k4-oracle", "costs": ["ddtree-b8-k4-oracle"]}}}
    spec["run_cells"] = {"g": ["ar"]}
    matrix.write_text(json.dumps(spec))
    (models / "target").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"vocab_size": 2048}))
    work = tmp_path / "work"
    try:
        done, _ = run_e2e(tmp_path, models, matrix, {}, "--patched-site", str(STANDIN), "--only",
                          "ddtree-b8-k4-real", "--keep-for", "g", "--cost-seconds", "0.2", run="g")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert "tune two: left out, its trace server ddtree-b8-k4-oracle is not started" in done.stdout
        assert "tune one: dflash-eager not started in this run, so not costed" in done.stdout
        with tarfile.open(tmp_path / "out" / "tune.tar.xz") as archive:
            assert sorted(n for n in archive.getnames() if n.endswith("costs.json")) == ["tune/one/costs.json"]
        (work / "trace-one.k26").write_text("an earlier run's trace")
        done, report = run_e2e(tmp_path, models, matrix, {}, "--patched-site", str(STANDIN), "--only",
                               "ddtree-b8-k4-real", "--keep-for", "g", "--cost-seconds", "0.2", run="g")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert "ddtree-b8-k4-real: traced in this run, so the kept one is stopped and started anew" in done.stdout
        by_name = {s["name"]: s for s in report["servers"]}
        assert by_name["ar"]["reused"] and not by_name["ddtree-b8-k4-real"]["reused"]
        assert not (work / "trace-one.k26").exists() and "tune one: no trace; not run" in done.stdout
        spec["tunes"] = {}
        matrix.write_text(json.dumps(spec))
        done, report = run_e2e(tmp_path, models, matrix, {}, "--patched-site", str(STANDIN), "--only",
                               "ddtree-b8-k4-real", run="g")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        assert ("ddtree-b8-k4-real: traced by the run that kept it and not by this one, so the kept one is "
                "stopped and started anew") in done.stdout, "a table never measures a tracing server"
        assert not {s["name"]: s for s in report["servers"]}["ddtree-b8-k4-real"]["reused"]
    finally:
        state = json.loads((work / "servers.json").read_text())
        for kept in state["servers"].values():
            try:
                os.killpg(kept["pid"], 9)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("flag", [("--cost-repeats", "0"), ("--cost-seconds", "0")])
def test_cost_settings_that_measure_nothing_are_refused_before_anything_starts(setup, flag):
    tmp_path, models, matrix = setup
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", "t",
           "--site", str(STANDIN), "--models", str(models), "--out", str(tmp_path / "out"),
           "--work", str(tmp_path / "work"), *flag]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--cost-repeats must be >= 1 and --cost-seconds > 0" in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_tune_keeps_the_trace_it_read_for_a_later_calls_table_group(tmp_path):
    """The trace server goes on appending to its live trace: what a group's tune read is kept in
    WORK once that tune has run, and a table group of a later run tunes on that copy, at the C
    its costs measured (a committed trace and costs, tune for real)."""
    import argparse
    import lzma
    import tarfile

    from proving_ground import tuning

    s10 = REPO / "bench" / "results" / "2026-12-02-wide-weak-costs-inside-table"
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    # The trace names its model by the device's path; tune compares names, it reads no weights.
    args = argparse.Namespace(work=work, out=out, models=Path("/tmp/k26/models-wide"), cost_seconds=0.2,
                              cost_repeats=1)
    trace = lzma.decompress((s10 / "wide-tune" / "tune" / "weak" / "trace.k26.xz").read_bytes())
    (work / "trace-weak.k26").write_bytes(trace)
    (out / "tune" / "weak").mkdir(parents=True)
    (out / "tune" / "weak" / "costs.json").write_bytes(
        lzma.decompress((s10 / "wide-tune" / "tune" / "weak" / "costs.json.xz").read_bytes()))
    said = []
    tune_args = ("--spine=on", "--min-budget=8", "--max-budget=32")
    tracing = tuning.TuneGroup("weak", "ddtree-b8-k4-weak-spine", (), tune_args)
    tuning.costs_and_tune([], [tracing], args, [[3, 4]], 8, time.time() + 120, said.append)
    assert said[-1].startswith("tune weak: exit 0"), said
    (work / "trace-weak.k26").write_bytes(trace + b"the table's steps after them")
    assert (work / "tuned-trace-weak.k26").read_bytes() == trace
    # Costs inside a table whose C=64 cell the deadline cut: tune plans for 1, 4 and 16.
    costs = json.loads(lzma.decompress((s10 / "wide-speed-costed" / "tune" / "weak-table" / "costs.json.xz").read_bytes()))
    costs["runs"] = [run for run in costs["runs"] if run["cells"][0]["concurrency"] != 64]
    (out / "tune" / "weak-table").mkdir(parents=True)
    (out / "tune" / "weak-table" / "costs.json").write_text(json.dumps(costs))
    table = tuning.TuneGroup("weak-table", "", (), tune_args, trace_from="weak")
    groups, notes = tuning.with_kept_traces([table], work, time.time())
    assert groups == [table] and notes == ["tune weak-table: tunes on the trace group weak tuned on 0 min ago"]
    tuning.costs_and_tune([], [table], args, [[3, 4]], 8, time.time() + 120, said.append)
    assert said[-1].startswith("tune weak-table: exit 0"), said
    with tarfile.open(out / "tune.tar.xz") as archive:
        assert archive.extractfile("tune/weak-table/trace.k26").read() == trace
        planned = json.load(archive.extractfile("tune/weak-table/tune.json"))["per_concurrency"]
    assert [p["concurrency"] for p in planned] == [1, 4, 16]
    (work / "tuned-trace-weak.k26").unlink()
    groups, notes = tuning.with_kept_traces([table], work, time.time())
    assert groups == [] and notes[0].startswith("tune weak-table: left out, no earlier run of this machine tuned "
                                                "group weak (")


def test_a_table_group_measures_its_costs_inside_the_speed_table(setup):
    """A speed run's table group: after the middle round of each greedy cell, one closed loop at that
    cell's C per cost server, the order rotated with C; the table's servers are not restarted to
    trace; tune runs at the end on the trace an earlier run's group tuned on."""
    import tarfile

    tmp_path, models, matrix = setup
    spec = json.loads(speed_matrix(tmp_path, matrix).read_text())
    spec["tunes"] = {"s": {"weak-table": {"trace_from": "weak", "costs": ["dflash", "ddtree-b8-k4-weak"]}}}
    path = tmp_path / "table-matrix.json"
    path.write_text(json.dumps(spec))
    (models / "target").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"vocab_size": 2048}))
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "tuned-trace-weak.k26").write_text("not a trace")
    done, report = run_e2e(tmp_path, models, path, {}, "--patched-site", str(STANDIN), "--cost-seconds", "0.2", run="s")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert report["overall"] == "PASS" and "traced in this run" not in done.stdout
    with tarfile.open(tmp_path / "out" / "tune.tar.xz") as archive:
        costs = json.load(archive.extractfile("tune/weak-table/costs.json"))
        assert archive.extractfile("tune/weak-table/trace.k26").read() == b"not a trace"
    runs = [(run["label"], [c["concurrency"] for c in run["cells"]]) for run in costs["runs"]]
    # greedy-c1 and greedy-c4 (sample-c4 is no greedy cell): C=1 is tune's first C, 4 its second.
    assert runs == [("dflash", [1]), ("ddtree-b8-k4-weak", [1]), ("ddtree-b8-k4-weak", [4]), ("dflash", [4])]
    started = {(c["server"], c["cell"]): c["repeat_started"] for c in report["speed"]}
    for run, cell in zip(costs["runs"], ["greedy-c1", "greedy-c1", "greedy-c4", "greedy-c4"]):
        # After round 2 of the cell's 3 (bench stamps whole seconds).
        stamp = datetime.datetime.strptime(run["started_at"], "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        rounds = [times for (_, name), times in started.items() if name == cell]
        assert max(t[1] for t in rounds) < stamp + 1 and stamp <= min(t[2] for t in rounds), (run, rounds)
    assert "tune weak-table costs in greedy-c4 dflash: exit 0" in done.stdout and "% stolen)" in done.stdout
    assert "tune weak-table: exit 2" in done.stdout


@pytest.mark.parametrize("line, status", [("", "stopped"), ("1", "failed: serves the plain target")])
def test_an_emulated_pair_is_served_through_the_emulator_package_and_checked_in_every_log(setup, line, status):
    tmp_path, models, matrix = setup
    (models / "target").mkdir()
    (models / "target" / "config.json").write_text(json.dumps({"k26_emulator": {"box": "pcie-ep8"}}))
    spec = json.loads(matrix.read_text())
    spec["runs"]["emu"] = ["ar", "dflash"]
    matrix.write_text(json.dumps(spec))
    env = {"STANDIN_NO_EMULATOR_LINE": line, "SGLANG_EXTERNAL_MODEL_PACKAGE": "not.this.one"} if line else {}
    done, report = run_e2e(tmp_path, models, matrix, env, run="emu")
    assert report["emulated"] == {"box": "pcie-ep8"}
    for server in report["servers"]:
        assert server["status"].startswith(status), server
    if line:
        assert done.returncode != 0 and report["overall"].startswith("FAIL")
    else:
        assert done.returncode == 0, done.stdout[-2000:]
        log = (tmp_path / "work" / "logs" / "ar.log").read_text()
        assert "k26 emulator: box pcie-ep8" in log


def test_a_server_of_another_sglang_runs_from_its_own_site_and_is_kept_only_with_that_bundle(setup, tmp_path):
    """-sglangX.Y.Z servers run from --site-for's folder; kept for a later run, they are reused while
    that site holds the bundle they started from, and stopped once another is installed there."""
    _, models, matrix = setup
    other = tmp_path / "site-sglang0.5.17"
    shutil.copytree(STANDIN, other)
    (other / ".k26-bundle").write_text("bundle-one\n")
    speed = speed_matrix(tmp_path, matrix)
    spec = json.loads(speed.read_text())
    spec["runs"]["keeper"] = ["ar", "dflash", "dflash-sglang0.5.17"]
    speed.write_text(json.dumps(spec))
    site_for = ("--site-for", f"0.5.17={other}")
    try:
        done, first = run_e2e(tmp_path, models, speed, {}, *site_for, "--keep-for", "keeper", run="keeper")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
        logs = tmp_path / "work" / "logs"
        assert f"from {other / 'sglang'}" in (logs / "dflash-sglang0.5.17.log").read_text()
        assert f"from {STANDIN / 'sglang'}" in (logs / "dflash.log").read_text()
        done, again = run_e2e(tmp_path, models, speed, {}, *site_for, "--keep-for", "keeper", run="keeper")
        assert all(s["reused"] for s in again["servers"]), again["servers"]
        (other / ".k26-bundle").write_text("bundle-two\n")
        done, third = run_e2e(tmp_path, models, speed, {}, *site_for, run="keeper")
        assert "runs another bundle of sglang 0.5.17 than the one installed now" in done.stdout
        reused = {s["name"]: s["reused"] for s in third["servers"]}
        assert reused == {"ar": True, "dflash": True, "dflash-sglang0.5.17": False}
    finally:
        state = json.loads((tmp_path / "work" / "servers.json").read_text())
        for kept in state["servers"].values():
            try:
                os.killpg(kept["pid"], 9)
            except ProcessLookupError:
                pass


def test_a_server_of_an_sglang_without_a_site_is_skipped_with_the_reason(setup):
    tmp_path, models, matrix = setup
    speed = speed_matrix(tmp_path, matrix)
    spec = json.loads(speed.read_text())
    spec["runs"]["keeper"] = ["ar", "dflash-sglang0.5.17"]
    speed.write_text(json.dumps(spec))
    done, report = run_e2e(tmp_path, models, speed, {}, run="keeper")
    status = {s["name"]: s["status"] for s in report["servers"]}
    assert status["dflash-sglang0.5.17"].startswith("skipped: no site for sglang 0.5.17"), status


@pytest.mark.parametrize("value, message", [
    ("0.5.17", "expected VERSION=DIR"),
    ("v1=/tmp", "expected VERSION=DIR"),
    ("0.5.17=/nonexistent/site", "/nonexistent/site is not a folder"),
])
def test_a_bad_site_for_is_one_line_and_exit_2(setup, value, message):
    tmp_path, models, matrix = setup
    env = dict(os.environ, PYTHONPATH=str(REPO), **STANDIN_ENV)
    cmd = [sys.executable, str(ENTRY), "--matrix", str(matrix), "--run", "t", "--site", str(STANDIN),
           "--models", str(models), "--out", str(tmp_path / "out"), "--site-for", value]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert not (tmp_path / "out").exists()

"""The matrix harness over real HTTP against the stand-in server: the numbers it computes."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from k26_ddtree.cli.main import main

TOKENS_PER_S = 20000.0
SMALL = ["--contexts", "16,64", "--concurrency", "1,4", "--output-len", "16", "--quiet"]


def bench(*args: str) -> int:
    return main(["bench", *args])


def only_run(path) -> dict:
    document = json.loads(path.read_text())
    assert document["schema"] == "k26-ddtree-bench/1"
    assert len(document["runs"]) == 1
    return document["runs"][0]


@pytest.mark.parametrize("accept", ["4.0", "2.0"])
def test_acceptance_and_counts_match_the_server(standin, tmp_path, accept):
    server = standin(
        env={"STANDIN_ACCEPT": accept},
        args=["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "4"],
    )
    out = tmp_path / "run.json"
    assert bench("--url", server.url, "--out", str(out), "--snapshot-id", "snap-1", "--profile", "pcie-ep8", *SMALL) == 0
    run = only_run(out)
    assert run["status"] == "complete"
    assert (run["label"], run["budget"], run["topk"]) == ("DDTREE b8 k4", 8, 4)
    assert run["snapshot_id"] == "snap-1" and run["profile"] == "pcie-ep8"
    assert run["git_sha"] and run["server_info"]["speculative_ddtree_budget"] == 8
    assert [(c["context"], c["concurrency"]) for c in run["cells"]] == [(16, 1), (16, 4), (64, 1), (64, 4)]
    for cell in run["cells"]:
        requests = max(8, 2 * cell["concurrency"])
        assert (cell["requests"], cell["ok"], cell["errors"], cell["has_errors"]) == (requests, requests, 0, False)
        assert cell["output_tokens"] == requests * 16
        assert cell["prompt_tokens"] == requests * cell["context"]  # random-ids prompts are exact
        assert cell["accept_length"] == pytest.approx(float(accept))
        assert cell["server_avg_spec_accept_length"] == pytest.approx(float(accept))
        # The stand-in streams at most TOKENS_PER_S per request: bounds, not a timing test.
        assert 0 < cell["output_tok_s"] <= TOKENS_PER_S * cell["concurrency"] * 1.05
        assert 0 < cell["request_tok_s"]["mean"] <= TOKENS_PER_S * 1.05
        assert cell["ttft_ms"]["count"] == requests
        assert cell["ttft_ms"]["p50"] <= cell["ttft_ms"]["p99"]
        assert cell["itl_ms"]["count"] == requests * (16 // int(float(accept)) - 1)
        assert cell["tpot_ms"]["mean"] is not None
        # The stand-in sleeps one step (accept / tokens_per_s) before every chunk: lower bounds.
        step_ms = float(accept) / TOKENS_PER_S * 1000
        steps = 16 // int(float(accept))
        assert min(cell["ttft_ms"]["p50"], cell["ttft_ms"]["mean"]) >= step_ms * 0.99
        assert cell["e2e_ms"]["p50"] >= steps * step_ms * 0.99
    with urllib.request.urlopen(f"{server.url}/server_info", timeout=10) as response:
        assert json.load(response)["standin_flush_count"] == 4  # one flush before every cell


def test_autoregressive_server_has_no_acceptance(standin, tmp_path):
    server = standin()
    out = tmp_path / "ar.json"
    assert bench("--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1", "--output-len", "8",
                 "--requests", "2", "--warmup", "0", "--quiet") == 0
    run = only_run(out)
    assert run["label"] == "AR" and run["algorithm"] == "AR"


def test_injected_errors_are_counted_and_marked(standin, tmp_path, capsys):
    server = standin(env={"STANDIN_ERROR_EVERY": "3"})
    out = tmp_path / "errors.json"
    code = bench("--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1,4",
                 "--output-len", "16", "--warmup", "0", "--quiet")
    assert code == 1
    assert "had failed requests" in capsys.readouterr().err
    cells = only_run(out)["cells"]
    # /generate calls 1-8 (cell 1) and 9-16 (cell 2); every third fails.
    assert [c["errors"] for c in cells] == [2, 3]
    assert [c["ok"] for c in cells] == [6, 5]
    assert all(c["has_errors"] and c["requests"] == 8 for c in cells)
    assert all(any("HTTP 500" in e for e in c["error_samples"]) for c in cells)
    assert all(c["output_tokens"] == c["ok"] * 16 for c in cells)


def test_runs_append_to_one_file(standin, tmp_path):
    server = standin()
    out = tmp_path / "both.json"
    common = ["--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1", "--output-len", "8",
              "--requests", "2", "--warmup", "0", "--quiet"]
    assert bench(*common, "--label", "first") == 0
    assert bench("run", *common, "--label", "second") == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["label"] for r in runs] == ["first", "second"]
    assert runs[0]["run_id"] != runs[1]["run_id"]


def test_api_key_is_sent_and_never_written(standin, tmp_path, monkeypatch, capsys):
    key = "k26-test-key-5c1e"
    server = standin(args=["--api-key", key])
    out = tmp_path / "key.json"
    common = ["--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1", "--output-len", "8",
              "--requests", "2", "--warmup", "0", "--quiet"]
    monkeypatch.delenv("K26_API_KEY", raising=False)
    assert bench(*common) == 2
    assert "401" in capsys.readouterr().err
    key_file = tmp_path / "api-key"
    key_file.write_text(key + "\n")
    assert bench(*common, "--api-key-file", str(key_file)) == 0
    monkeypatch.setenv("K26_API_KEY", key)
    assert bench(*common) == 0
    captured = capsys.readouterr()
    assert key not in out.read_text() and key not in captured.out + captured.err
    assert only_run_count(out) == 2


def only_run_count(path) -> int:
    return len(json.loads(path.read_text())["runs"])


def test_unreachable_server_is_one_line_error(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    code = bench("--url", closed, "--out", str(tmp_path / "x.json"), "--ready-timeout", "2", *SMALL)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "not healthy" in err
    assert not (tmp_path / "x.json").exists()


def test_waiting_for_the_server_says_what_it_waits_for(tmp_path, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26_ddtree", "bench", "--url", closed, "--out", str(tmp_path / "x.json"),
         "--ready-timeout", "30"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        ready, _, _ = select.select([proc.stderr], [], [], 15)
        assert ready, "15s of silence while waiting for the server"
        first = proc.stderr.readline()
    finally:
        proc.kill()
        proc.communicate(timeout=30)
    assert first.startswith(f"bench: waiting for {closed}/health_generate to answer 200 (0s of 30s; now: Connect")
    assert main(["bench", "--url", closed, "--out", str(tmp_path / "x.json"), "--ready-timeout", "1"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"bench: waiting for {closed}/health_generate") and err[-1].startswith(
        f"k26-deploy: error: {closed} not healthy after 1s: {closed}/health_generate never answered 200 "
        "(last: Connect")


def test_ctrl_c_keeps_finished_cells(standin, tmp_path):
    server = standin(env={"STANDIN_TOKENS_PER_S": "100"})
    out = tmp_path / "interrupted.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26_ddtree", "bench", "--url", server.url, "--out", str(out),
         "--contexts", "16,32,64", "--concurrency", "1,2", "--output-len", "16", "--warmup", "0", "--quiet"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if out.exists() and json.loads(out.read_text())["runs"][0]["cells"]:
            break
        time.sleep(0.05)
    else:
        proc.kill()
        pytest.fail("no cell finished within 60s")
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    run = only_run(out)
    assert run["status"] == "interrupted" and run["finished_at"]
    finished = [c for c in run["cells"] if not c["interrupted"]]
    assert 1 <= len(finished) < 6
    assert all(c["ok"] == c["requests"] for c in finished)


def test_ctrl_c_before_any_cell_says_nothing_was_written(tmp_path):
    out = tmp_path / "never.json"
    # A closed port: bench waits for /health_generate until the interrupt.
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26_ddtree", "bench", "--url", "http://127.0.0.1:9", "--out", str(out),
         "--ready-timeout", "60"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    waiting = proc.stderr.readline()
    assert waiting.startswith("bench: waiting for"), waiting
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert f"bench: interrupted; no cell finished, nothing was written to {out}" in err
    assert not out.exists()

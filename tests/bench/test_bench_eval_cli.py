"""The coding eval through both endpoints of the stand-in, and the CLI surface."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bench_reference_solutions import REFERENCE

from k26_ddtree.cli.main import main

REPO_ROOT = __import__("pathlib").Path(__file__).resolve().parents[2]
TASKS = ["run_length_encode", "roman_to_int", "merge_intervals", "is_balanced", "flatten", "chunk_evenly"]


def fenced(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def replies() -> dict:
    return {
        # Wrong draft while thinking, right answer after </think>: passes.
        "`run_length_encode(": "<think>First try:\n" + fenced("def run_length_encode(s):\n    return []")
        + "\nThat ignores runs.</think>\nFinal answer:\n" + fenced(REFERENCE["run_length_encode"]),
        # The only code is in the reasoning: never counts.
        "`roman_to_int(": "<think>" + fenced(REFERENCE["roman_to_int"]) + "</think>The function is above.",
        # Reasoning cut off by max_tokens: no code.
        "`merge_intervals(": "<think>Sort, then sweep.\n" + fenced(REFERENCE["merge_intervals"]) + "\nBut touching",
        # A wrong answer: the hidden tests catch it.
        "`is_balanced(": "<think>easy</think>" + fenced("def is_balanced(s):\n    return True"),
        # Kimi thinking markers.
        "`flatten(": "◁think▷draft◁/think▷" + fenced(REFERENCE["flatten"]),
    }


def run_eval(standin, tmp_path, env: dict, endpoints: str, args: list[str] = ()) -> dict:
    replies_file = tmp_path / "replies.json"
    replies_file.write_text(json.dumps(replies()))
    server = standin(env={"STANDIN_REPLIES_FILE": str(replies_file), **env}, args=list(args))
    out = tmp_path / "eval.json"
    task_args = [arg for task in TASKS for arg in ("--task", task)]
    assert main(["bench", "eval", "--url", server.url, "--out", str(out), "--eval-endpoints", endpoints,
                 "--quiet", *task_args]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert run["status"] == "complete" and run["cells"] == []
    return run["coding_eval"]


def outcome(endpoint_result: dict) -> dict:
    return {r["task"]: (r["passed"], r["reason"]) for r in endpoint_result["results"]}


@pytest.mark.parametrize("server_args", [[], ["--incremental-streaming-output"]], ids=["cumulative", "incremental"])
def test_eval_without_reasoning_parser(standin, tmp_path, server_args, isolation):
    evaluation = run_eval(standin, tmp_path, {}, "chat,generate", server_args)
    assert evaluation["tasks"] == TASKS and evaluation["sandbox"] == isolation.note
    assert evaluation["generate_prompt"].startswith("plain text")
    for endpoint in ("chat", "generate"):
        result = evaluation["endpoints"][endpoint]
        got = outcome(result)
        assert got["run_length_encode"] == (True, "passed")
        assert got["flatten"] == (True, "passed")
        assert got["roman_to_int"] == (False, "no code: no fenced code block in the answer")
        assert got["merge_intervals"] == (False, "no code: reasoning truncated (no end marker)")
        assert got["is_balanced"][0] is False and "AssertionError" in got["is_balanced"][1]
        assert got["chunk_evenly"][0] is False
        assert (result["passed"], result["total"], result["pass_at_1"]) == (2, 6, 2 / 6)
        assert result["request_errors"] == 0 and result["completion_tokens"] > 0 and result["output_tok_s"] > 0
    assert evaluation["endpoints"]["generate"]["accept_length"] is not None
    assert evaluation["endpoints"]["chat"]["accept_length"] is None
    report_dir = tmp_path / "report"
    assert main(["bench", "report", str(tmp_path / "eval.json"), "--out", str(report_dir)]) == 0
    report = (report_dir / "report.md").read_text()
    assert "## Coding eval (pass@1)" in report and "| **pass@1** | **2/6** | **2/6** |" in report
    assert "| roman_to_int | FAIL | FAIL |" in report and not list(report_dir.glob("*.png"))


def test_eval_with_reasoning_parser(standin, tmp_path, isolation):
    evaluation = run_eval(standin, tmp_path, {"STANDIN_REASONING_PARSER": "1"}, "chat")
    got = outcome(evaluation["endpoints"]["chat"])
    assert got["run_length_encode"] == (True, "passed")
    assert got["roman_to_int"][0] is False
    assert got["merge_intervals"] == (False, "no code: reasoning truncated (empty content)")
    assert list(evaluation["endpoints"]) == ["chat"]


def test_run_with_eval_flag(standin, tmp_path, isolation):
    server = standin()
    out = tmp_path / "both.json"
    assert main(["bench", "run", "--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "1",
                 "--output-len", "8", "--requests", "2", "--warmup", "0", "--eval", "--eval-endpoints", "generate",
                 "--task", "flatten", "--quiet"]) == 0
    run = json.loads(out.read_text())["runs"][0]
    assert len(run["cells"]) == 1 and run["coding_eval"]["endpoints"]["generate"]["total"] == 1


@pytest.mark.parametrize("command", [["eval"], ["run", "--eval"]], ids=["eval", "run-eval"])
def test_without_bubblewrap_the_eval_refuses_before_anything_runs(tmp_path, command):
    """PATH without bwrap; the server URL is closed, so a refusal after waiting would take 60s."""
    done = subprocess.run([sys.executable, "-m", "k26_ddtree", "bench", *command, "--url", "http://127.0.0.1:9",
                           "--out", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=30, env={**os.environ, "PATH": str(tmp_path)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("k26-deploy: error: the coding eval runs model-written code only inside "
                                  "bubblewrap, and bwrap is not installed: install it (apt-get install bubblewrap) "
                                  "or pass --eval-unsandboxed")
    assert not (tmp_path / "r.json").exists()


def test_python_dash_m_bench_from_the_repo_root():
    done = subprocess.run([sys.executable, "-m", "bench", "--help"], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0 and "usage: k26-deploy bench" in done.stdout
    for sub in ("run", "eval", "report", "sweep"):
        assert sub in done.stdout


def test_user_mistakes_are_one_line(tmp_path, capsys):
    assert main(["bench", "--url", "http://127.0.0.1:9", "--id-range", "9:1", "--out", str(tmp_path / "x.json")]) == 2
    assert main(["bench", "eval", "--task", "no_such_task"]) == 2
    assert main(["bench", "--api-key-file", str(tmp_path / "missing")]) == 2
    assert main(["bench", "--tokenizer", "x"]) == 2
    assert main(["bench", "eval", "--eval-endpoints", "chat,completions"]) == 2
    assert main(["bench", "--prompt-file", str(tmp_path / "none.txt"), "--url", "http://127.0.0.1:9",
                 "--out", str(tmp_path / "y.json")]) == 2
    assert not (tmp_path / "y.json").exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("k26-deploy: error: ") for line in err)
    done = subprocess.run([sys.executable, "-m", "k26_ddtree", "bench", "--concurrency", "0"], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "positive integers" in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize("args, expected", [
    (["--request-timeout", "0"], "--request-timeout must be a finite number of seconds > 0"),
    (["--ready-timeout", "nan"], "--ready-timeout must be a finite number of seconds > 0"),
    (["--temperature", "-1"], "--temperature must be 0 or more"),
    (["--out", "/proc/no-such-dir/x.json", "--url", "{url}"], "--out /proc/no-such-dir/x.json: the folder /proc/no-such-dir does not exist"),
    (["sweep", "--budget", "4", "--topk", "4", "--reconfigure-timeout", "-1"],
     "--reconfigure-timeout must be a finite number of seconds > 0"),
    (["sweep", "--budget", "4", "--topk", "4", "--reconfigure-cmd", "'unterminated"],
     "--reconfigure-cmd: cannot split"),
    (["eval", "--eval-test-timeout", "-1"], "--eval-test-timeout must be a finite number of seconds > 0"),
    (["eval", "--tasks", "{bad_yaml}"], "line 2 is not valid YAML: expected ',' or ']'"),
    (["--api-key-file", "{binary}"], "is not text (not UTF-8)"),
    (["--url", "notaurl"], "--url 'notaurl' must be an http(s) URL with a host"),
])
def test_bad_numbers_paths_and_templates_are_one_line(standin, tmp_path, capsys, args, expected):
    bad_yaml = tmp_path / "tasks.yaml"
    bad_yaml.write_text("a: [1, 2\n")
    (tmp_path / "binary").write_bytes(b"\xff\xfe")
    url = standin().url if "{url}" in args else "http://127.0.0.1:9"
    argv = [a.replace("{url}", url).replace("{bad_yaml}", str(bad_yaml)).replace("{binary}", str(tmp_path / "binary"))
            for a in args]
    sub, rest = (argv[:1], argv[1:]) if argv[0] in ("sweep", "eval") else ([], argv)
    assert main(["bench", *sub, "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "r.json"), *rest]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k26-deploy: error: ") and expected in err[0], err
    assert not (tmp_path / "r.json").exists()

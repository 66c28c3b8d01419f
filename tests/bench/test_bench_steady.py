"""`bench run --steady` (closed-loop repeats) and `--prompt-set` (exact prompts), over real HTTP
against the stand-in server, and the issuing policy they share with the proving ground."""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import pytest

from k26_ddtree.bench import steady
from k26_ddtree.bench.client import ServerClient
from k26_ddtree.bench.closed_loop import ClosedLoop
from k26_ddtree.cli.main import main
from k26_ddtree.tune.costs import load_costs

DDTREE = ["--speculative-algorithm", "DDTREE", "--speculative-ddtree-budget", "8", "--speculative-ddtree-topk", "4"]
# 16 tokens at acceptance 4 are 4 verify steps of 4/400 s: 40 ms per request.
SLOW = {"STANDIN_TOKENS_PER_S": "400"}


def bench(*args: str) -> int:
    """The exit code, a usage error's (argparse exits) included."""
    try:
        return main(["bench", "run", *args])
    except SystemExit as done:
        return done.code


def only_run(path) -> dict:
    runs = json.loads(path.read_text())["runs"]
    assert len(runs) == 1
    return runs[0]


def server_info(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/server_info", timeout=10) as response:
        return json.load(response)


def sent(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def take_all(loop: ClosedLoop, now: float) -> list[int]:
    taken = []
    while (index := loop.take(now)) is not None:
        taken.append(index)
    return taken


def test_the_policy_rotates_issues_whole_cycles_and_at_least_c():
    assert take_all(ClosedLoop(4, 2, 0.0, start=0.0, first=1), 0.0) == [1, 2, 3, 0]
    assert take_all(ClosedLoop(3, 5, 0.0, start=0.0), 0.0) == [0, 1, 2] * 2  # at least C, in whole cycles
    loop = ClosedLoop(2, 1, 10.0, start=100.0)
    assert [loop.take(105.0) for _ in range(4)] == [0, 1, 0, 1]  # before SECONDS: cycles go on
    assert loop.take(110.0) is None and loop.issued == 4
    mid_cycle = ClosedLoop(2, 1, 10.0, start=0.0)
    assert mid_cycle.take(1.0) == 0 and mid_cycle.take(20.0) == 1 and mid_cycle.take(20.0) is None


def test_steady_cells_keep_c_in_flight_in_whole_cycles_for_seconds(standin, tmp_path):
    server = standin(env={**SLOW, "STANDIN_ACCEPT": "4.0"}, args=DDTREE)
    out = tmp_path / "steady.json"
    assert bench("--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "4",
                 "--output-len", "16", "--requests", "6", "--warmup", "2", "--steady", "0.3", "--repeats", "3",
                 "--quiet") == 0
    info = server_info(server)
    assert info["standin_generate_peak"] == 4 and info["standin_streamed"] == 0  # since the flush: measured only
    run = only_run(out)
    assert run["settings"]["matrix"]["steady"] == {"seconds": 0.3, "repeats": 3}
    (cell,) = run["cells"]
    steady = cell["steady"]
    assert steady["seconds"] == 0.3 and len(steady["repeats"]) == 3
    for repeat in steady["repeats"]:
        assert repeat["requests"] % 6 == 0 and repeat["requests"] >= 6
        assert 0.3 <= repeat["wall_s"] < 0.3 + 2.0  # stops at the first cycle end after SECONDS
        # the fillers' tokens so far count too: they kept the batch at C until the set's last reply
        assert repeat["output_tokens"] >= 16 * repeat["requests"] and repeat["spec_verify_ct"] >= 4 * repeat["requests"]
        # a slot may run several fillers; only those still running at the set's end are aborted
        assert repeat["fillers_aborted"] <= min(3, repeat["fillers"])
        assert repeat["tok_s"] == pytest.approx(repeat["output_tokens"] / repeat["wall_s"])
    rates = [r["tok_s"] for r in steady["repeats"]]
    assert cell["output_tok_s"] == statistics.median(rates)
    assert (steady["min_tok_s"], steady["max_tok_s"]) == (min(rates), max(rates))
    total = sum(r["requests"] for r in steady["repeats"])
    assert (cell["requests"], cell["ok"], cell["errors"], cell["has_errors"]) == (total, total, 0, False)
    assert info["standin_unstreamed"] == total + sum(r["fillers"] for r in steady["repeats"])
    assert cell["accept_length"] == pytest.approx(4.0)
    assert cell["duration_s"] == pytest.approx(sum(r["wall_s"] for r in steady["repeats"]))
    assert cell["ttft_ms"]["count"] == 0 and cell["e2e_ms"]["count"] == total
    costs = load_costs(out)  # tune's step time of a steady cell: C * accept_length / the median repeat's rate
    assert costs.tree == {4: {8: pytest.approx(4 * cell["accept_length"] / cell["output_tok_s"])}}


def test_a_repeat_keeps_its_batch_full_with_fillers_until_its_set_is_done(standin, tmp_path):
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps({"long": " w" * 60, "short": " w w"}))  # a token is a word
    server = standin(env={**SLOW, "STANDIN_REPLIES_FILE": str(replies)})
    prompts = [{"text": "long"}, {"text": "short"}, {"text": "short"}, {"text": "short"}]

    async def go():
        async with ServerClient(server.url, None, 30.0, 2) as client:
            return await steady.run_repeat(client, prompts, 2, {"max_new_tokens": 64}, 0.0, 0)

    repeat = asyncio.run(go())
    # one slot holds the long request (0.15 s) while the other runs the short ones, then fillers
    # from prompt 0 on (a long one first), each aborted once the long request is in
    assert len(repeat.records) == 4 and all(r.ok for r in repeat.records)
    assert repeat.fillers and all(f.aborted and f.completion_tokens < 60 for f in repeat.fillers)
    assert repeat.output_tokens == 60 + 3 * 2 + sum(f.completion_tokens for f in repeat.fillers)
    described = repeat.describe()
    assert described["requests"] == 4 and described["fillers_aborted"] == described["fillers"] >= 1


def test_failed_requests_of_a_repeat_count_in_the_cell(standin, tmp_path):
    server = standin(env={**SLOW, "STANDIN_ERROR_EVERY": "5"})
    out = tmp_path / "errors.json"
    assert bench("--url", server.url, "--out", str(out), "--contexts", "16", "--concurrency", "2",
                 "--output-len", "16", "--requests", "4", "--warmup", "0", "--steady", "0.1", "--repeats", "2",
                 "--quiet") == 1
    (cell,) = only_run(out)["cells"]
    # every 5th /generate of the server's fails, fillers' too: a failed filler is a failed request of the cell
    assert cell["has_errors"] and cell["errors"] >= 1
    assert cell["ok"] + cell["errors"] == sum(r["requests"] for r in cell["steady"]["repeats"])


def write_set(path, lines: list[str]):
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_prompt_set_reaches_the_server_as_given_in_order(standin, tmp_path):
    log = tmp_path / "prompts.log"
    server = standin(env={**SLOW, "STANDIN_PROMPT_LOG": str(log)})
    prompts = [{"input_ids": [5, 6, 7, 8]}, {"text": "two words"}, {"input_ids": [9, 10, 11, 12, 13, 14]}]
    path = write_set(tmp_path / "set.jsonl", [json.dumps(prompts[0]), "", json.dumps(prompts[1]), "  ",
                                              json.dumps(prompts[2])])
    out = tmp_path / "set.json"
    common = ["--url", server.url, "--out", str(out), "--prompt-set", str(path), "--concurrency", "1",
              "--output-len", "8", "--warmup", "0", "--quiet"]
    assert bench(*common) == 0
    assert [{k: v for k, v in p.items() if k != "stream"} for p in sent(log)] == prompts
    assert bench(*common, "--requests", "5") == 0
    assert [{k: v for k, v in p.items() if k != "stream"} for p in sent(log)[3:]] == (prompts * 2)[:5]
    log.unlink()
    assert bench(*common, "--steady", "0.01", "--repeats", "2") == 0
    texts = [p.get("text") or p["input_ids"][0] for p in sent(log)]
    assert texts == [5, "two words", 9, "two words", 9, 5]  # a whole cycle per repeat, rotated by one
    runs = json.loads(out.read_text())["runs"]
    for run in runs:
        assert [c["context"] for c in run["cells"]] == [4]  # mean of 4 ids, 2 words, 6 ids
        described = run["settings"]["prompts"]
        assert described["kind"] == "prompt-set" and described["file"] == str(path) and described["prompts"] == 3
        assert len(described["sha256"]) == 64
    assert [r["cells"][0]["requests"] for r in runs] == [3, 5, 6]


def test_a_cell_of_a_small_prompt_set_sends_whole_cycles_enough_for_c_in_flight(standin, tmp_path):
    log = tmp_path / "prompts.log"
    server = standin(env={**SLOW, "STANDIN_PROMPT_LOG": str(log)})
    path = write_set(tmp_path / "set.jsonl", [json.dumps({"input_ids": [5 + i, 6]}) for i in range(3)])
    out = tmp_path / "small.json"
    assert bench("--url", server.url, "--out", str(out), "--prompt-set", str(path), "--concurrency", "4",
                 "--output-len", "16", "--warmup", "0", "--quiet") == 0
    assert server_info(server)["standin_generate_peak"] == 4, "a cell labelled C=4 had 4 in flight"
    assert sorted(p["input_ids"][0] for p in sent(log)) == [5, 5, 6, 6, 7, 7], "two whole cycles"
    (cell,) = only_run(out)["cells"]
    assert (cell["planned_requests"], cell["requests"]) == (6, 6)


def test_a_prompt_set_id_past_the_vocabulary_is_refused_before_any_request(standin, tmp_path, capsys):
    server = standin()
    path = write_set(tmp_path / "past.jsonl", [json.dumps({"input_ids": [1, 40000]})])
    assert bench("--url", server.url, "--out", str(tmp_path / "x.json"), "--prompt-set", str(path), "--quiet") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "40000" in err and str(path) in err
    assert server_info(server)["standin_flush_count"] == 0


def closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.mark.parametrize("content, expected", [
    (None, "cannot read"),
    (b"", "holds no prompt"),
    (b"\n  \n", "holds no prompt"),
    (b"\xff\xfe\n", "not UTF-8"),
    (b'{"text": "ok"}\n{not json\n', "line 2: not JSON"),
    (b"[1, 2]\n", "line 1: not a JSON object"),
    (b"{}\n", "line 1: needs exactly one"),
    (b'{"text": "a", "input_ids": [1]}\n', "line 1: needs exactly one"),
    (b'{"input_ids": "12"}\n', "line 1: \"input_ids\" is not"),
    (b'{"input_ids": []}\n', "line 1: \"input_ids\" is not"),
    (b'{"input_ids": [1, -2]}\n', "line 1: \"input_ids\" is not"),
    (b'{"input_ids": [1, true]}\n', "line 1: \"input_ids\" is not"),
    (b'{"input_ids": [1.5]}\n', "line 1: \"input_ids\" is not"),
    (b'\n{"text": ""}\n', "line 2: \"text\" is not"),
    (b'{"text": 3}\n', "line 1: \"text\" is not"),
    (b'{"input_ids": [' + b"9" * 5000 + b']}\n', "line 1: not JSON"),
])
def test_a_bad_prompt_set_is_one_line_before_the_server_is_asked(tmp_path, capsys, content, expected):
    path = tmp_path / "set.jsonl"
    if content is not None:
        path.write_bytes(content)
    assert bench("--url", closed_url(), "--out", str(tmp_path / "x.json"), "--ready-timeout", "1",
                 "--prompt-set", str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err and expected in err, err
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize("flag", ["--prompt-set", "--prompt-file"])
@pytest.mark.parametrize("kind", ["fifo", "directory", "device"])
def test_a_prompt_file_that_is_no_regular_file_is_refused_not_read(tmp_path, capsys, flag, kind):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)  # no writer: opening it to read would wait for ever
    elif kind == "directory":
        path.mkdir()
    else:
        path = "/dev/zero"  # would be read until memory runs out
    assert bench("--url", closed_url(), "--out", str(tmp_path / "x.json"), "--ready-timeout", "1",
                 flag, str(path)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{flag} {path} is not a regular file" in err, err


def test_prompt_set_lines_end_at_newlines_only(standin, tmp_path):
    log = tmp_path / "prompts.log"
    server = standin(env={**SLOW, "STANDIN_PROMPT_LOG": str(log)})
    texts = ["one\u2028two", "three\x85four", "five\u2029six"]
    path = tmp_path / "set.jsonl"
    # A byte-order mark first, as some editors save; the separators raw, as ensure_ascii=False writes them.
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"text": t}, ensure_ascii=False) + "\r\n"
                                                 for t in texts).encode())
    assert bench("--url", server.url, "--out", str(tmp_path / "x.json"), "--prompt-set", str(path),
                 "--concurrency", "1", "--output-len", "4", "--warmup", "0", "--quiet") == 0
    assert [p["text"] for p in sent(log)] == texts


@pytest.mark.parametrize("extra, expected", [
    (["--prompt-file", "x.txt"], "--prompt-file exclude"),
    (["--id-range", "1:9"], "--id-range exclude"),
    (["--contexts", "16"], "--contexts exclude"),
    (["--steady", "1", "--requests", "4"], "the steady cycle is the whole set"),
])
def test_prompt_set_conflicts_are_one_line(tmp_path, capsys, extra, expected):
    path = write_set(tmp_path / "set.jsonl", ['{"text": "hello"}'])
    assert bench("--url", closed_url(), "--out", str(tmp_path / "x.json"), "--prompt-set", str(path), *extra) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err, err


@pytest.mark.parametrize("flags, expected", [
    (["--repeats", "3"], "--repeats only applies to --steady"),
    (["--steady", "0"], "--steady"),
    (["--steady", "nan"], "--steady"),
    (["--steady", "1", "--repeats", "0"], "--repeats"),
])
def test_steady_flag_mistakes_are_one_line(tmp_path, capsys, flags, expected):
    assert bench("--url", closed_url(), "--out", str(tmp_path / "x.json"), *flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err, err


def test_ctrl_c_in_a_steady_cell_keeps_its_finished_repeats(standin, tmp_path):
    server = standin(env=SLOW)
    out = tmp_path / "interrupted.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "k26_ddtree", "bench", "run", "--url", server.url, "--out", str(out),
         "--contexts", "16", "--concurrency", "2", "--output-len", "16", "--requests", "4", "--warmup", "0",
         "--steady", "0.2", "--repeats", "100"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    deadline = time.monotonic() + 60
    seen = ""
    while "repeat 2/100" not in seen:
        ready, _, _ = select.select([proc.stderr], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            proc.kill()
            pytest.fail(f"no repeat finished within 60s: {seen}")
        seen += proc.stderr.readline()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    run = only_run(out)
    assert run["status"] == "interrupted"
    (cell,) = run["cells"]
    assert cell["interrupted"] and 2 <= len(cell["steady"]["repeats"]) < 100
    assert cell["requests"] == sum(r["requests"] for r in cell["steady"]["repeats"])


def test_sweep_forwards_steady_and_the_prompt_set(standin, tmp_path):
    server = standin(env=SLOW, args=DDTREE)
    path = write_set(tmp_path / "set.jsonl", [json.dumps({"input_ids": [3, 4, 5]})])
    out = tmp_path / "sweep.json"
    assert main(["bench", "sweep", "--budget", "8", "--topk", "4", "--reconfigure-cmd", "true", "--url", server.url,
                 "--out", str(out), "--prompt-set", str(path), "--concurrency", "2", "--output-len", "8",
                 "--warmup", "0", "--steady", "0.01", "--repeats", "2", "--quiet"]) == 0
    run = only_run(out)
    assert run["settings"]["matrix"]["steady"] == {"seconds": 0.01, "repeats": 2}
    assert run["settings"]["prompts"]["kind"] == "prompt-set"
    assert [(c["context"], len(c["steady"]["repeats"])) for c in run["cells"]] == [(3, 2)]

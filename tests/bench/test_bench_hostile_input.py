"""Hostile input to `bench run|sweep`: answers nested too deep, flags past their bounds, empty or
repeated values, a symlinked --out. Each is one line with exit 2 (or counted failed requests),
never a traceback, and nothing is written on a refusal."""

from __future__ import annotations

import json
import os

import pytest
from model_server import ModelServer, write_model_folder

from k26_ddtree.cli.main import main

SMALL = ["--contexts", "16", "--concurrency", "1", "--output-len", "4", "--requests", "2", "--warmup", "0", "--quiet"]
CLOSED = "http://127.0.0.1:9"  # nothing listens: a flag that passed parsing would wait on it, then fail


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("k26-deploy: error: "), err
    return err[0]


def refused_at_parse_time(argv: list[str], capsys) -> str:
    """The error line of a flag argparse refuses (before any server is asked or file written)."""
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return one_error_line(capsys)


# 100000 levels: json.loads itself gives up (RecursionError); 200: it parses, but the secret
# scrubber and the results writer would recurse past Python's limit.
@pytest.mark.parametrize("depth", [100_000, 200])
def test_a_server_info_nested_too_deep_is_one_line_naming_the_endpoint(tmp_path, capsys, depth):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    with ModelServer(32000, str(folder), bodies={"/server_info": nested(depth)}) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL]) == 2
    line = one_error_line(capsys)
    assert line == f"k26-deploy: error: {server.url}/server_info answered JSON nested deeper than 64 levels"
    assert not out.exists()


def test_a_server_info_as_deep_as_allowed_is_recorded_and_read_back(tmp_path):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    info = {"model_path": str(folder), "internal_states": [{}], "deep": json.loads(nested(63))}
    with ModelServer(32000, str(folder), bodies={"/server_info": json.dumps(info).encode()}) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL]) == 0
    assert main(["bench", "report", str(out), "--out", str(tmp_path / "report")]) == 0


@pytest.mark.parametrize("depth", [100_000, 200])
def test_a_stream_chunk_nested_too_deep_is_a_failed_request(tmp_path, capsys, depth):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    with ModelServer(32000, str(folder), bodies={"/generate": b"data: " + nested(depth) + b"\n\n"}) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL]) == 1
    assert "Traceback" not in capsys.readouterr().err
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert cell["errors"] == 2 and cell["error_samples"] == ["TooDeep: JSON nested deeper than 64 levels"]


def test_a_results_file_nested_too_deep_is_one_line(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_bytes(b'{"schema": "k26-ddtree-bench/1", "runs": [' + nested(5000) + b"]}")
    assert main(["bench", "report", str(path), "--out", str(tmp_path / "report")]) == 2
    assert one_error_line(capsys) == (f"k26-deploy: error: {path} is not a k26-deploy bench results file "
                                      "(JSON nested deeper than 100 levels)")
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize("flag, value, expected", [
    ("--concurrency", "99999999", "argument --concurrency: at most 4096 requests in flight"),
    ("--concurrency", "1,4097", "argument --concurrency: at most 4096 requests in flight"),
    ("--requests", "8193", "argument --requests: at most 8192 requests per cell"),
])
def test_concurrency_and_requests_are_bounded_at_parse_time(tmp_path, capsys, flag, value, expected):
    out = tmp_path / "run.json"
    for sub in ([], ["sweep", "--budget", "8", "--topk", "4"]):
        line = refused_at_parse_time(["bench", *sub, "--url", CLOSED, "--ready-timeout", "1", "--out", str(out),
                                      flag, value], capsys)
        assert expected in line, line
    assert not out.exists()


def test_the_largest_concurrency_and_request_count_parse():
    from k26_ddtree.cli.main import build_parser

    args = build_parser().parse_args(["bench", "--concurrency", "1,4096", "--requests", "8192"])
    assert args.concurrency == (1, 4096) and args.requests == 8192


@pytest.mark.parametrize("flag, value, expected", [
    ("--concurrency", "1,,2", "expected comma-separated integers, got '1,,2' (an empty item)"),
    ("--concurrency", "1,2,", "expected comma-separated integers, got '1,2,' (an empty item)"),
    ("--concurrency", "1,1", "1 given twice in '1,1'"),
    ("--contexts", "64, 16,64", "64 given twice in '64, 16,64'"),
])
def test_empty_and_repeated_list_items_are_refused(tmp_path, capsys, flag, value, expected):
    line = refused_at_parse_time(["bench", "--url", CLOSED, "--ready-timeout", "1",
                                  "--out", str(tmp_path / "run.json"), flag, value], capsys)
    assert f"argument {flag}: {expected}" in line, line
    line = refused_at_parse_time(["bench", "sweep", "--budget", "4,,8", "--topk", "4", "--url", CLOSED], capsys)
    assert "argument --budget: expected comma-separated integers, got '4,,8' (an empty item)" in line


def test_a_negative_id_range_says_ids_are_never_negative(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["bench", "--url", CLOSED, "--out", str(out), "--id-range=-5:10"]) == 2
    assert one_error_line(capsys) == ("k26-deploy: error: --id-range LOW is -5: token ids are never negative "
                                      "(0 <= LOW < HIGH)")
    assert not out.exists()


@pytest.mark.parametrize("argv", [
    ["bench", "run", "--out", ""],
    ["bench", "sweep", "--budget", "8", "--topk", "4", "--out", ""],
    ["bench", "report", "x.json", "--out", ""],
    ["bench", "report", ""],
    ["bench", "--prompt-file", ""],
])
def test_an_empty_path_is_refused_as_empty(capsys, argv):
    server = ["--url", CLOSED, "--ready-timeout", "1"] if argv[1] != "report" else []
    line = refused_at_parse_time([*argv, *server], capsys)
    assert "is empty: give a path" in line and "Is a directory" not in line, line


@pytest.mark.parametrize("template", ["", "   "])
def test_an_empty_reconfigure_command_is_one_line(tmp_path, capsys, template):
    out = tmp_path / "sw.json"
    assert main(["bench", "sweep", "--budget", "8", "--topk", "4", "--reconfigure-cmd", template, "--url", CLOSED,
                 "--out", str(out)]) == 2
    assert "--reconfigure-cmd is empty" in one_error_line(capsys)
    assert not out.exists() and not out.with_suffix(".sweep.md").exists()


def _bench(url: str, out, label: str) -> int:
    return main(["bench", "--url", url, "--out", str(out), "--label", label, *SMALL])


def test_out_through_a_symlink_appends_to_the_file_it_names(tmp_path):
    folder = write_model_folder(tmp_path / "model", 32000)
    real, link = tmp_path / "real.json", tmp_path / "latest.json"
    with ModelServer(32000, str(folder)) as server:
        assert _bench(server.url, real, "first") == 0
        link.symlink_to(real.name)
        assert _bench(server.url, link, "second") == 0
        dangling = tmp_path / "later.json"
        dangling.symlink_to("results/new.json")  # names a file not there yet, in a folder not there yet
        assert _bench(server.url, dangling, "third") == 2, "a missing folder is never created silently"
        assert not (tmp_path / "results").exists()
        (tmp_path / "results").mkdir()
        assert _bench(server.url, dangling, "third") == 0
    assert link.is_symlink() and os.readlink(link) == "real.json"
    assert [r["label"] for r in json.loads(real.read_text())["runs"]] == ["first", "second"]
    assert dangling.is_symlink() and json.loads((tmp_path / "results/new.json").read_text())["runs"][0]["label"] == \
        "third"


def test_out_as_a_symlink_loop_is_one_line(tmp_path, capsys):
    folder = write_model_folder(tmp_path / "model", 32000)
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop.name)
    with ModelServer(32000, str(folder)) as server:
        assert _bench(server.url, loop, "x") == 2
    assert one_error_line(capsys) == f"k26-deploy: error: --out {loop} is a symlink loop"
    assert loop.is_symlink() and os.readlink(loop) == loop.name


@pytest.mark.parametrize("make, expected", [
    (lambda t: (t / "z.json").symlink_to("/dev/zero") or t / "z.json", "is a character device"),
    (lambda t: os.mkfifo(t / "f.json") or t / "f.json", "is a FIFO"),
    (lambda t: t, "is a folder"),
    (lambda t: t / "absent" / "r.json", "does not exist (create it first)"),
])
def test_out_that_is_no_regular_file_is_refused_unread(tmp_path, capsys, make, expected):
    out = make(tmp_path)
    assert main(["bench", "--url", CLOSED, "--ready-timeout", "1", "--out", str(out)]) == 2
    line = one_error_line(capsys)
    assert line.startswith(f"k26-deploy: error: --out {out}") and expected in line, line


def test_a_steady_loop_longer_than_a_day_is_refused(tmp_path, capsys):
    line = refused_at_parse_time(["bench", "--url", CLOSED, "--out", str(tmp_path / "r.json"), "--steady", "1e308"],
                                 capsys)
    assert "argument --steady: expected at most 86400 seconds (a day), got '1e308'" in line, line

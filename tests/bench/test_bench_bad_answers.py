"""A server that answers 200 with nonsense: one error line (or counted failed requests), never a traceback."""

from __future__ import annotations

import json
import time

import pytest
from model_server import ModelServer, write_model_folder

from k26_ddtree.cli.main import main

SMALL = ["--contexts", "16", "--concurrency", "1", "--output-len", "4", "--requests", "2", "--warmup", "0", "--quiet"]
BODIES = {"not-utf8": b"\xff\xfe\xfa", "array": b"[1,2,3]", "null": b"null"}


@pytest.mark.parametrize("endpoint", ["/server_info", "/model_info"])
@pytest.mark.parametrize("body", list(BODIES.values()), ids=list(BODIES))
def test_an_info_endpoint_answering_nonsense_is_one_line(tmp_path, capsys, endpoint, body):
    folder = write_model_folder(tmp_path / "model", 32000)
    with ModelServer(32000, str(folder), bodies={endpoint: body}) as server:
        code = main(["bench", "--url", server.url, "--out", str(tmp_path / "run.json"), *SMALL])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    expected = "did not answer JSON" if body == BODIES["not-utf8"] else ", not a JSON object"
    assert err[0].startswith(f"k26-deploy: error: {server.url}{endpoint} ") and expected in err[0], err


@pytest.mark.parametrize("body", [b"data: \xff\xfe\n\n", b"data: [1,2,3]\n\n", b"data: null\n\n",
                                  b'data: {"meta_info": [1], "text": "x"}\n\n',
                                  b'data: {"meta_info": {"completion_tokens": -4}, "text": "x"}\n\n',
                                  b'data: {"meta_info": {"completion_tokens": 1e999}, "text": "x"}\n\n'],
                         ids=["not-utf8", "array", "null", "meta-array", "negative", "inf"])
def test_a_stream_of_nonsense_counts_as_failed_requests(tmp_path, capsys, body):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    with ModelServer(32000, str(folder), bodies={"/generate": body}) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL]) == 1
    assert "Traceback" not in capsys.readouterr().err
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert (cell["requests"], cell["errors"], cell["has_errors"]) == (2, 2, True)


@pytest.mark.parametrize("body", [*BODIES.values(), b'{"choices": [{"message": [1]}]}'],
                         ids=[*BODIES, "message-array"])
def test_a_chat_answer_of_nonsense_is_a_failed_eval_request(tmp_path, capsys, isolation, body):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "eval.json"
    with ModelServer(32000, str(folder), bodies={"/v1/chat/completions": body}) as server:
        assert main(["bench", "eval", "--url", server.url, "--out", str(out), "--eval-endpoints", "chat",
                     "--task", "flatten", "--quiet"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    chat = json.loads(out.read_text())["runs"][0]["coding_eval"]["endpoints"]["chat"]
    assert chat["request_errors"] == 1 and chat["results"][0]["reason"].startswith("request failed: ")


@pytest.mark.parametrize("body", [b"\xff\xfe", b"[1,2,3]", b"null", b'{"meta_info": [1]}', b'{"error": "boom"}',
                                  b'{"meta_info": {"completion_tokens": "many"}}', b'{"meta_info": {}}',
                                  b'{"meta_info": {"completion_tokens": 1e999}}',
                                  b'{"meta_info": {"completion_tokens": -4}}',
                                  b'{"meta_info": {"completion_tokens": 4, "spec_verify_ct": -1}}'],
                         ids=["not-utf8", "array", "null", "meta-array", "error", "count-text", "no-tokens", "inf",
                              "negative", "negative-verify"])
def test_a_plain_answer_of_nonsense_counts_as_failed_steady_requests(tmp_path, capsys, body):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    with ModelServer(32000, str(folder), bodies={"/generate": body}) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL, "--steady", "0.01",
                     "--repeats", "2"]) == 1
    assert "Traceback" not in capsys.readouterr().err
    cell = json.loads(out.read_text())["runs"][0]["cells"][0]
    assert (cell["requests"], cell["errors"], cell["has_errors"], cell["output_tok_s"]) == (4, 4, True, None)


def test_a_trickled_plain_answer_fails_within_the_request_timeout(tmp_path, capsys):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    started = time.monotonic()
    with ModelServer(32000, str(folder), trickle_s=0.2) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL, "--requests", "1", "--steady", "0.01",
                     "--repeats", "1", "--request-timeout", "1"]) == 1
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    (cell,) = json.loads(out.read_text())["runs"][0]["cells"]
    assert (cell["requests"], cell["errors"]) == (1, 1)


def test_a_trickled_stream_fails_within_the_request_timeout(tmp_path, capsys):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    started = time.monotonic()
    with ModelServer(32000, str(folder), trickle_s=0.2, trickle_paths=frozenset({"/generate"})) as server:
        assert main(["bench", "--url", server.url, "--out", str(out), *SMALL, "--requests", "1",
                     "--request-timeout", "1"]) == 1
    assert time.monotonic() - started < 20
    assert "Traceback" not in capsys.readouterr().err
    (cell,) = json.loads(out.read_text())["runs"][0]["cells"]
    assert (cell["requests"], cell["errors"]) == (1, 1)


def test_a_trickled_health_answer_ends_the_ready_wait_at_its_timeout(tmp_path, capsys):
    folder = write_model_folder(tmp_path / "model", 32000)
    started = time.monotonic()
    with ModelServer(32000, str(folder), trickle_s=0.5, trickle_paths=frozenset({"/health_generate"})) as server:
        code = main(["bench", "--url", server.url, "--out", str(tmp_path / "run.json"), *SMALL,
                     "--ready-timeout", "2"])
    assert time.monotonic() - started < 20
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("k26-deploy: error: ") and "not healthy after 2s" in err[-1], err


@pytest.mark.parametrize("endpoint", ["/server_info", "/generate"])
def test_an_answer_larger_than_the_cap_is_refused_unread(tmp_path, capsys, endpoint):
    folder = write_model_folder(tmp_path / "model", 32000)
    out = tmp_path / "run.json"
    with ModelServer(32000, str(folder), huge={endpoint: 64 << 20}) as server:
        code = main(["bench", "--url", server.url, "--out", str(out), *SMALL, "--requests", "1", "--steady", "0.01",
                     "--repeats", "1"])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    if endpoint == "/server_info":
        assert code == 2 and "the answer is larger than 16 MB" in err.strip().splitlines()[-1]
    else:
        (cell,) = json.loads(out.read_text())["runs"][0]["cells"]
        assert code == 1 and (cell["requests"], cell["errors"]) == (1, 1)

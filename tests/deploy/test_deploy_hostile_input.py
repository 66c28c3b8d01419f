"""Hostile and mistaken profile values through the real CLI: no flag smuggled into a unit, no secret in
one, each refusal one line with exit code 2 that names the key to use instead."""

from __future__ import annotations

import json

import pytest

from deploy_helpers import exec_start_words, k26, one_line_error

RENDER = ("render", "--allow-missing-model", "--no-verify", "--profile", "pcie-ep8")
WORKERS = "router.worker_urls=http://10.0.0.1:30000"


def render(*sets: str, router: bool = False):
    args = [*RENDER, *(["--router"] if router else [])]
    for assignment in sets:
        args += ["--set", assignment]
    return k26(*args)


def render_extra(tmp_path, words: list[str]):
    """extra_args exactly as given (a YAML list: a --set list would split at commas)."""
    path = tmp_path / "extra.yaml"
    path.write_text(f"extends: pcie-ep8\nextra_args: {json.dumps(words)}\n")
    return k26("render", "--allow-missing-model", "--no-verify", "--profile", str(path))


@pytest.mark.parametrize(
    "words, expected",
    [
        (["--host=0.0.0.0"], "'--host=0.0.0.0' sets --host, which the profile sets through its key host"),
        (["--host", "0.0.0.0"], "sets --host, which the profile sets through its key host: set host instead"),
        (["--hos", "0.0.0.0"], "'--hos' (SGLang reads --hos as --host) sets --host"),
        (["--hos=0.0.0.0"], "(SGLang reads --hos as --host) sets --host"),
        (["--port=1"], "sets --port, which the profile sets through its key port"),
        (["--model-path=/x"], "sets --model-path, which the profile sets through its key model"),
        (["--model", "/x"], "sets --model-path, which the profile sets through its key model"),
        (["--tensor-parallel-size", "4"], "sets --tp-size, which the profile sets through its key parallel.tp_size"),
        (["--ep", "2"], "through its key parallel.ep_size"),
        (["--disable-cuda-graph"], "through its key cuda_graph"),
        (["--speculative-ddtree-budget", "4"], "through its key speculative.budget"),
        (["--speculative-ddtree-trace=/x"], "through its key speculative.trace"),
        (["--api-key=secret"], "sets the API key, which would be plain text in the unit file: set api_key: true"),
        (["--api", "secret"], "(SGLang reads --api as --api-key) sets the API key"),
        (["--admin-api-key", "s"], "sets a secret (--admin-api-key), which would be plain text in the unit file"),
        (["--ssl-keyfile-password=s"], "sets a secret (--ssl-keyfile-password)"),
        (["--config", "/etc/x.yaml"], "--config reads further flags from a file"),
        (["--spec", "x"], "--spec is ambiguous to SGLang's parser (--speculative-algorithm"),
        (["--no-such-flag"], "'--no-such-flag' is not an SGLang 0.5.11 flag"),
        (["--chunked-prefill-size", "8192", "-x"], "entry '-x' is not an SGLang flag"),
        (["8192"], "must start with a --flag, got '8192'"),
    ],
)
def test_extra_args_set_nothing_the_profile_owns_and_no_secret(tmp_path, words, expected):
    message = one_line_error(render_extra(tmp_path, words))
    assert "profile extra: extra_args " in message and expected in message


@pytest.mark.parametrize("words", [["--chunked-prefill-size=8192"], ["--chunked-prefill", "8192"],
                                   ["--enable-cache-report", "--log-level", "info"], ["--chunked-prefill-size", "-1"]])
def test_other_flags_pass_in_every_spelling_argparse_takes(tmp_path, words):
    proc = render_extra(tmp_path, words)
    assert proc.returncode == 0, proc.stderr
    words_out = exec_start_words(proc.stdout)
    assert words_out[-len(words):] == words and words_out.count("--host") == 1


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["host=--evil", "open_without_api_key=true"], "host must be an IP address or an RFC 1123 host name"),
        (["host=exa mple"], "host must be an IP address or an RFC 1123 host name"),
        (["host=999.1.1.1"], "got '999.1.1.1'"),
        (["host=-node1"], "got '-node1'"),
        (["host=[::1]"], "got '[::1]'"),
        (["router.host=--evil"], "router.host must be an IP address or an RFC 1123 host name"),
        (["parallel.nnodes=2", "parallel.dist_init_addr=--evil:5000"], "parallel.dist_init_addr must be HOST:PORT"),
        (["parallel.nnodes=2", "parallel.dist_init_addr=::1:5000"], "(IPv6 needs brackets)"),
        (["parallel.nnodes=2", "parallel.dist_init_addr=node0:0"], "(PORT must be 1..65535)"),
        (["attention_backend=--evil"], "attention_backend must be triton with speculative.algorithm DDTREE"),
        (["attention_backend=flashinfer"], "attention_backend must be triton with speculative.algorithm DDTREE"),
        (["speculative.algorithm=DFLASH", "attention_backend=--evil"], "attention_backend must be one of triton, "),
        (["parallel.moe_a2a_backend=--evil"], "parallel.moe_a2a_backend must be one of none, deepep"),
        (["tool_call_parser=--evil"], "tool_call_parser must be one of "),
        (["reasoning_parser=nope"], "reasoning_parser must be one of "),
        (["served_model_name=--evil"], "served_model_name must not start with '-' (it would reach --served-model-name"),
        (["context_length=-5"], "context_length must be >= 1 or null, got -5"),
        (["environment.HF_TOKEN=hf_x"], "environment.HF_TOKEN looks like a secret"),
    ],
)
def test_server_values_are_what_their_flags_take(sets, expected):
    assert expected in one_line_error(render(*sets))


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["router.worker_urls=--evil"], "router.worker_urls entry '--evil' must be an http(s) URL with a host"),
        (["router.worker_urls=notaurl"], "entry 'notaurl' must be an http(s) URL with a host"),
        (["router.worker_urls=ftp://x"], "entry 'ftp://x' must be an http(s) URL with a host"),
        (["router.worker_urls=http://a:0"], "entry 'http://a:0' must be an http(s) URL with a host"),
        (["router.worker_urls=http://u:pw@a:1"], "must not carry a user or password"),
        (["router.worker_urls=http://a:1/v1"], "must be a base URL"),
        (["router.worker_urls=http://exa_mple:1"], "has a host that must be an IP address or an RFC 1123 host name"),
        ([WORKERS, "router.policy=nope"], "router.policy must be one of random, round_robin, cache_aware, "
                                          "power_of_two, manual, got 'nope'"),
    ],
)
def test_router_values_are_urls_and_choices(sets, expected):
    assert expected in one_line_error(render(*sets, router=True))


@pytest.mark.parametrize("host", ["localhost", "node1.example", "10.0.0.5", "::", "fd00::1"])
def test_addresses_and_names_that_are_hosts_pass(host):
    proc = render(f"host={host}", "api_key=true", "parallel.nnodes=2", "parallel.dist_init_addr=node0:5000")
    assert proc.returncode == 0, proc.stderr
    words = exec_start_words(proc.stdout)
    assert words[words.index("--host") + 1] == host


def test_the_router_binds_loopback_by_default_and_opens_only_with_a_key():
    proc = render("router.worker_urls=http://10.0.0.1:30000,https://[fd00::2]:443", router=True)
    assert proc.returncode == 0, proc.stderr
    words = exec_start_words(proc.stdout)
    assert words[words.index("--host") + 1] == "127.0.0.1" and "--api-key" not in words
    i = words.index("--worker-urls")
    assert words[i + 1:i + 3] == ["http://10.0.0.1:30000", "https://[fd00::2]:443"]
    assert "router.host 0.0.0.0 listens beyond loopback" in one_line_error(
        render(WORKERS, "router.host=0.0.0.0", router=True))


@pytest.mark.parametrize(
    "sets, expected",
    [
        (["speculative=1"], "--set speculative: speculative is a section, set one of its keys: "
                            "speculative.algorithm, speculative.block_size, "),
        (["router=x"], "router is a section, set one of its keys: router.host, router.port"),
        (["speculative.budget.x=1"], "speculative.budget is a key, not a section (--set speculative.budget=VALUE)"),
    ],
)
def test_set_says_what_a_section_holds(sets, expected):
    assert expected in one_line_error(render(*sets))


def test_a_profile_path_that_is_a_directory_says_so(tmp_path):
    folder = tmp_path / "dirprof.yaml"
    folder.mkdir()
    assert f"profile {folder} is a directory, not a YAML file" in one_line_error(
        k26(*RENDER[:-1], str(folder)))
    extends = tmp_path / "child.yaml"
    extends.write_text("extends: ./dirprof.yaml\n")
    message = one_line_error(k26(*RENDER[:-1], str(extends)))
    assert f"profile {extends}: extends: profile {folder} is a directory" in message


@pytest.mark.parametrize("args, expected", [
    (("install", "--allow-missing-model", "--profile", "pcie-ep8", "--root", ""), "--root is empty"),
    (("install", "--allow-missing-model", "--profile", "pcie-ep8", "--root", "{tmp}", "--state-dir", ""),
     "--state-dir is empty"),
    (("status", "--state-dir", ""), "--state-dir is empty"),
])
def test_an_empty_directory_flag_is_an_error_not_the_default(tmp_path, args, expected):
    message = one_line_error(k26(*(a.replace("{tmp}", str(tmp_path)) for a in args)))
    assert expected in message
    assert not (tmp_path / "etc").exists(), "nothing written"

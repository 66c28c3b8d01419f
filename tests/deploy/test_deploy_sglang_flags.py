"""Every flag a profile emits exists in the pinned SGLang 0.5.11 parser (plus our patch's DDTree flags).

Read from the real server_args.py of the pinned wheel (or that file with the
patch set's diff applied, with the flags k26_ddtree/sglang/v0_5_11/args.py registers),
by AST: no sglang import, no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from deploy_helpers import REPO, k26, one_line_error
from sglang_source import (
    DDTREE_ARGS_MODULE, DDTREE_FLAGS, Arg, dict_keys, parser_args, patched_server_args, unpacked_wheel,
    wheel_source,
)

from k26_ddtree.deploy import sglanggen
from k26_ddtree.deploy.flags import (
    ALIASES, API_KEY_REFERENCE, REFUSED_FLAGS, ROUTER_PACKAGE, ROUTER_POLICIES, SERVER_FLAG_KEYS, is_secret_name,
    router_flags, server_flags,
)
from k26_ddtree.deploy.profiles import load_profile, shipped_names
from k26_ddtree.deploy.schema import Profile
from k26_ddtree.deploy.sglang_cli import CHOICES, OPTIONS
from k26_ddtree.deploy.values import dotted_keys
from k26_ddtree.patchset.wheel import shipped_wheel

pytestmark = pytest.mark.network
STUBS = REPO / "tests" / "sglang_cpu" / "stubs"

VARIANTS = [
    [],
    ["speculative.spine=true", "cuda_graph=false", "api_key=true"],
    ["parallel.nnodes=2", "parallel.node_rank=1", "parallel.dist_init_addr=10.0.0.1:5000"],
    ["mem_fraction_static=0.85", "context_length=65536", "max_running_requests=32"],
    ["speculative.algorithm=DFLASH", "extra_args=--chunked-prefill-size,8192,--enable-cache-report"],
    ["speculative.trace=/var/lib/k26-ddtree/trace.bin", "speculative.trace_max_mb=64"],
]


@pytest.fixture(scope="module")
def sglang_parser() -> dict[str, Arg]:
    pristine = parser_args(wheel_source("sglang/srt/server_args.py"))
    assert "--speculative-dflash-block-size" in pristine and "--tp-size" in pristine, "AST read found the parser"
    patched_source = patched_server_args()
    if patched_source is not None:
        patched = parser_args(patched_source)
        if DDTREE_ARGS_MODULE.is_file():
            patched.update(parser_args(DDTREE_ARGS_MODULE.read_text(encoding="utf-8")))
        for flag, kind in DDTREE_FLAGS.items():
            assert flag in patched and patched[flag].switch == (kind == "switch"), f"the patch defines {flag}"
        return patched
    merged = dict(pristine)
    for flag, kind in DDTREE_FLAGS.items():
        assert flag not in pristine, f"{flag} is ours, not SGLang's"
        merged[flag] = Arg(switch=kind == "switch", choices=None)
    algorithm = pristine["--speculative-algorithm"]
    merged["--speculative-algorithm"] = Arg(algorithm.switch, algorithm.choices | {"DDTREE"})
    return merged


@pytest.fixture(scope="module")
def parser_names() -> dict[str, set[str]]:
    """Choices SGLang computes at import time from its parser registries."""
    return {
        "--tool-call-parser": dict_keys(wheel_source("sglang/srt/function_call/function_call_parser.py"),
                                        "ToolCallParserEnum"),
        "--reasoning-parser": dict_keys(wheel_source("sglang/srt/parser/reasoning_parser.py"), "DetectorMap"),
    }


@pytest.mark.parametrize("sets", VARIANTS, ids=["shipped", "switches", "multi-node", "limits", "dflash-extra", "trace"])
@pytest.mark.parametrize("name", shipped_names())
def test_profile_flags_exist_in_the_pinned_parser(name, sets, sglang_parser, parser_names):
    flags = server_flags(load_profile(name, sets))
    assert flags, "a profile emits flags"
    for flag, value in flags:
        assert flag in sglang_parser, f"{name} {sets}: {flag} is not an SGLang 0.5.11 (+DDTree) flag"
        arg = sglang_parser[flag]
        if arg.switch:
            assert value is None, f"{flag} is a switch in SGLang but the profile gives it {value!r}"
            continue
        assert value is not None, f"{flag} takes a value in SGLang but the profile emits it bare"
        choices = parser_names.get(flag, arg.choices)
        if choices is not None:
            assert value in choices, f"{flag} {value!r} is not one of SGLang's choices {sorted(choices)}"


def test_the_issue_flags_are_emitted_with_their_values():
    emitted = dict(server_flags(load_profile("pcie-ep8")))
    assert emitted["--speculative-algorithm"] == "DDTREE"
    assert emitted["--speculative-dflash-block-size"] == "8"
    assert emitted["--speculative-dflash-draft-window-size"] == "2048"
    assert (emitted["--speculative-ddtree-budget"], emitted["--speculative-ddtree-topk"]) == ("8", "4")
    assert (emitted["--tp-size"], emitted["--ep-size"], emitted["--moe-a2a-backend"]) == ("8", "8", "none")
    assert emitted["--attention-backend"] == "triton" and emitted["--host"] == "127.0.0.1"
    assert emitted["--tool-call-parser"] == emitted["--reasoning-parser"] == "kimi_k2"
    for switch in ("--trust-remote-code", "--skip-server-warmup", "--enable-metrics"):
        assert emitted[switch] is None
    assert "--cuda-graph-max-bs" in emitted and "--api-key" not in emitted
    assert "--speculative-ddtree-trace" not in emitted and emitted["--speculative-ddtree-trace-max-mb"] == "1024"
    traced = dict(server_flags(load_profile("pcie-ep8", ["speculative.trace=/var/lib/k26-ddtree/t.bin",
                                                         "speculative.trace_max_mb=64"])))
    assert traced["--speculative-ddtree-trace"] == "/var/lib/k26-ddtree/t.bin"
    assert traced["--speculative-ddtree-trace-max-mb"] == "64"
    nvlink = dict(server_flags(load_profile("nvlink-tp8-nvls")))
    assert "--enable-nccl-nvls" in nvlink and "--ep-size" not in nvlink


# The router's own entry point turns the words into its RouterArgs; we print what it understood.
PARSE_ROUTER = """
import json, sys
from sglang_router.launch_router import parse_router_args
args = parse_router_args(sys.argv[1:])
print(json.dumps({k: getattr(args, k) for k in ("worker_urls", "host", "port", "policy", "api_key")}))
"""


@pytest.mark.parametrize("sets", [["api_key=true"], ["router.host=0.0.0.0", "open_without_api_key=true",
                                                    "router.policy=round_robin"]], ids=["with-key", "opt-out"])
def test_router_flags_parse_with_the_pinned_router(sets):
    profile = load_profile("pcie-ep8", ["router.worker_urls=http://10.0.0.1:30000,http://10.0.0.2:30000", *sets])
    words = []
    for flag, value in router_flags(profile):
        words += [flag, *(value if isinstance(value, list) else [value] if value is not None else [])]
    site = unpacked_wheel(ROUTER_PACKAGE)
    proc = subprocess.run([sys.executable, "-c", PARSE_ROUTER, *words], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(site)})
    assert proc.returncode == 0, proc.stderr
    parsed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert parsed["worker_urls"] == ["http://10.0.0.1:30000", "http://10.0.0.2:30000"]
    assert (parsed["host"], parsed["port"], parsed["policy"]) == (profile.router.host, 30080, profile.router.policy)
    assert parsed["api_key"] == (API_KEY_REFERENCE if profile.api_key else None)


def test_router_policies_are_the_pinned_routers_choices():
    script = ("import argparse, json\nfrom sglang_router.router_args import RouterArgs\n"
              "parser = argparse.ArgumentParser()\nRouterArgs.add_cli_args(parser)\n"
              "print(json.dumps(next(a.choices for a in parser._actions if '--policy' in a.option_strings)))")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(unpacked_wheel(ROUTER_PACKAGE))})
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == list(ROUTER_POLICIES)


def test_the_committed_sglang_table_is_generated_from_the_pinned_wheel():
    committed = sglanggen.TARGET.read_text(encoding="utf-8")
    assert committed == sglanggen.sglang_cli(sglanggen.reader(shipped_wheel())), (
        "k26_ddtree/deploy/sglang_cli.py is stale: run python -m k26_ddtree.deploy.sglanggen SGLANG_WHEEL")


# SGLang's own parser, as `sglang.launch_server` builds it: the pinned package with our patched
# server_args.py in its place. It reports its arguments and, per case, which of the `watched` flags'
# destinations the case's words set (None: argparse refuses the words or exits).
REAL_PARSER = """
import argparse, contextlib, importlib.util, io, json, sys
import sglang.srt
spec = importlib.util.spec_from_file_location("sglang.srt.server_args", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)
parser = argparse.ArgumentParser(prog="sglang serve")
module.ServerArgs.add_cli_args(parser)
request = json.load(sys.stdin)
watched = [a for a in parser._actions if set(a.option_strings) & set(request["watched"])]
for action in watched:
    action.required = False  # --model-path: the cases are extra_args alone
unset = object()  # not a string: argparse would pass a string default through the flag's type
parser.set_defaults(**{a.dest: unset for a in watched})
results = []
for words in request["cases"]:
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            namespace = parser.parse_args(words)
    except SystemExit:
        results.append(None)
        continue
    results.append([a.option_strings[0] for a in watched if getattr(namespace, a.dest) is not unset])
actions = {option: a for a in parser._actions for option in a.option_strings}
print(json.dumps({"options": [a.option_strings for a in parser._actions], "results": results,
                  "choices": {flag: list(actions[flag].choices) for flag in request["choices"]}}))
"""

# extra_args with well-formed values (SGLang checks the values; k26-deploy checks which flags they set).
EXTRA_CASES = [
    ["--chunked-prefill-size", "8192"], ["--chunked-prefill-size=8192"], ["--chunked-prefill", "8192"],
    ["--enable-cache-report"], ["--log-level", "info"], ["--chunked-prefill-size", "-1"],
    ["--no-record-nolora-graph"], ["--record-nolora"], ["--enable-cache"],
    ["--host=0.0.0.0"], ["--host", "0.0.0.0"], ["--hos", "0.0.0.0"], ["--ho=0.0.0.0"], ["--port=1"], ["--por", "1"],
    ["--model-path=/x"], ["--model", "/x"], ["--mod", "/x"], ["--served-model-name", "x"],
    ["--api-key=s"], ["--api", "s"], ["--admin-api-key", "s"], ["--admin", "s"], ["--ssl-keyfile-password=s"],
    ["--tensor-parallel-size", "4"], ["--tp", "4"], ["--ep", "2"], ["--ep-size=2"], ["--nccl-init-addr", "a:1"],
    ["--speculative-ddtree-trace=/x"], ["--speculative-ddtree-b", "4"], ["--speculative-draft-model", "/x"],
    ["--disable-cuda-graph"], ["--enable-metrics"], ["--enable-metric"], ["--trust-remote"], ["--skip-server"],
    ["--cuda-graph-max", "8"], ["--mem-fraction-static=0.5"], ["--max-running", "4"],
    ["--attention-backend=triton"], ["--config", "/x.yaml"], ["--conf", "/x.yaml"], ["--help"],
    ["--no-such-flag"], ["--host 0.0.0.0"], ["--chunked-prefill-size", "8192", "-x"], ["--", "x"], ["8192"],
]


@pytest.fixture(scope="module")
def real_parser(pristine_sglang, tmp_path_factory):
    watched = [o for group in OPTIONS for o in group
               if o in SERVER_FLAG_KEYS or o in REFUSED_FLAGS or is_secret_name(o)]
    request = {"watched": watched, "cases": EXTRA_CASES, "choices": list(CHOICES)}
    server_args = tmp_path_factory.mktemp("patched") / "server_args.py"
    server_args.write_text(patched_server_args(), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", REAL_PARSER, str(server_args)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(pristine_sglang), str(STUBS)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_table_is_sglangs_own_parser(real_parser):
    assert sorted(map(tuple, real_parser["options"])) == sorted(OPTIONS)
    assert real_parser["choices"] == {flag: list(choices) for flag, choices in CHOICES.items()}
    assert {o for o in ALIASES if is_secret_name(o)} == {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}
    for flag, key in SERVER_FLAG_KEYS.items():
        assert flag in ALIASES and key in dotted_keys(Profile), (flag, key)


def test_extra_args_are_refused_exactly_when_sglang_would_set_an_owned_flag_or_refuse_them(real_parser, tmp_path):
    wrong = []
    for words, watched_set in zip(EXTRA_CASES, real_parser["results"]):
        path = tmp_path / "extra.yaml"
        path.write_text(f"extends: pcie-ep8\nextra_args: {json.dumps(words)}\n")
        proc = k26("render", "--allow-missing-model", "--no-verify", "--profile", str(path))
        if (proc.returncode == 0) != (watched_set == []):
            wrong.append((words, watched_set, proc.returncode, proc.stderr.strip()))
        elif proc.returncode != 0:
            one_line_error(proc)
    assert not wrong, "k26-deploy and SGLang's parser disagree:\n" + "\n".join(map(str, wrong))

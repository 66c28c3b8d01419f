"""Every flag a profile emits exists in the pinned SGLang 0.5.11 parser (plus our patch's DDTree flags).

Read from the real server_args.py of the pinned wheel (or the patched copy in
patches/ with the flags k26_ddtree/sglang/args.py registers), by AST: no
sglang import, no GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_source import (
    DDTREE_ARGS_MODULE, DDTREE_FLAGS, PATCHED_SERVER_ARGS, Arg, dict_keys, parser_args, unpacked_wheel, wheel_source,
)

from k26_ddtree.deploy.flags import API_KEY_REFERENCE, ROUTER_PACKAGE, router_flags, server_flags
from k26_ddtree.deploy.profiles import load_profile, shipped_names

pytestmark = pytest.mark.network

VARIANTS = [
    [],
    ["speculative.spine=true", "cuda_graph=false", "api_key=true"],
    ["parallel.nnodes=2", "parallel.node_rank=1", "parallel.dist_init_addr=10.0.0.1:5000"],
    ["mem_fraction_static=0.85", "context_length=65536", "max_running_requests=32"],
    ["speculative.algorithm=DFLASH", "extra_args=--chunked-prefill-size,8192,--enable-cache-report"],
]


@pytest.fixture(scope="module")
def sglang_parser() -> dict[str, Arg]:
    pristine = parser_args(wheel_source("sglang/srt/server_args.py"))
    assert "--speculative-dflash-block-size" in pristine and "--tp-size" in pristine, "AST read found the parser"
    if PATCHED_SERVER_ARGS.is_file():
        patched = parser_args(PATCHED_SERVER_ARGS.read_text(encoding="utf-8"))
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


@pytest.mark.parametrize("sets", VARIANTS, ids=["shipped", "switches", "multi-node", "limits", "dflash-extra"])
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
    nvlink = dict(server_flags(load_profile("nvlink-tp8-nvls")))
    assert "--enable-nccl-nvls" in nvlink and "--ep-size" not in nvlink


# The router's own entry point turns the words into its RouterArgs; we print what it understood.
PARSE_ROUTER = """
import json, sys
from sglang_router.launch_router import parse_router_args
args = parse_router_args(sys.argv[1:])
print(json.dumps({k: getattr(args, k) for k in ("worker_urls", "host", "port", "policy", "api_key")}))
"""


@pytest.mark.parametrize("sets", [["api_key=true"], ["open_without_api_key=true", "router.policy=round_robin"]],
                         ids=["with-key", "opt-out"])
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
    assert (parsed["host"], parsed["port"], parsed["policy"]) == ("0.0.0.0", 30080, profile.router.policy)
    assert parsed["api_key"] == (API_KEY_REFERENCE if profile.api_key else None)

"""The flags profiles render, per SGLang version, against that version's table, and each table
against its pinned wheel with the patch set applied; the router's flags against the pinned router.

Nothing here imports sglang: the tables are read from the real sources by AST
(k26_ddtree.deploy.sglanggen), and test_deploy_sglang_parser.py holds each table to SGLang's
own parser.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from deploy_helpers import k26, one_line_error
from sglang_source import unpacked_wheel

from k26_ddtree.deploy import sglanggen
from k26_ddtree.deploy.flags import (
    API_KEY_REFERENCE, RESPELLED, ROUTER_PACKAGE, ROUTER_POLICIES, router_flags, server_flags, spelling_problem,
)
from k26_ddtree.deploy.profiles import load_profile, profiles_dir, shipped_names
from k26_ddtree.deploy.sglang_cli import ServerCli, for_version, versions
from k26_ddtree.patchset.pins import shipped_versions
from k26_ddtree.repro.sglang_versions import PINS

pytestmark = pytest.mark.network

VARIANTS = [
    [],
    ["speculative.spine=true", "cuda_graph=false", "api_key=true"],
    ["parallel.nnodes=2", "parallel.node_rank=1", "parallel.dist_init_addr=10.0.0.1:5000"],
    ["mem_fraction_static=0.85", "context_length=65536", "max_running_requests=32"],
    ["speculative.algorithm=DFLASH", "extra_args=--chunked-prefill-size,8192,--enable-cache-report"],
    ["speculative.trace=/var/lib/k26-ddtree/trace.bin", "speculative.trace_max_mb=64"],
    ["speculative.schedule=1:8/4,16:0"],
]
VARIANT_IDS = ["shipped", "switches", "multi-node", "limits", "dflash-extra", "trace", "schedule"]


def for_version_of(name: str, sets: list[str], version: str):
    """A shipped profile with `sets`, written for SGLang `version` whatever pairings refuse (its flags are
    what matter here; test_deploy_sglang_versions.py covers the refusals)."""
    return dataclasses.replace(load_profile(name, sets), sglang_version=version)


def test_every_version_k26_ddtree_installs_has_a_patch_set_and_a_flag_table():
    assert sorted(PINS) == shipped_versions() == versions()


@pytest.mark.parametrize("version", shipped_versions())
def test_the_committed_table_is_generated_from_the_pinned_wheel_and_patch_set(version):
    committed = sglanggen.target(version).read_text(encoding="utf-8")
    assert committed == sglanggen.table_text(version, sglanggen.patched_reader(version)), (
        f"{sglanggen.target(version)} is stale: run python -m k26_ddtree.deploy.sglanggen {version}")


@pytest.mark.parametrize("version", shipped_versions())
@pytest.mark.parametrize("sets", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("name", shipped_names())
def test_every_flag_a_profile_renders_is_one_of_its_versions_own(name, sets, version):
    cli = for_version(version)
    profile = for_version_of(name, sets, version)
    assert spelling_problem(profile, cli) is None
    flags = [flag for flag, _ in server_flags(profile)]
    assert flags, "a profile emits flags"
    for flag in flags:
        assert flag in cli.aliases, f"{name} {sets}: {flag} is not an SGLang {version} (+DDTree) flag"
        assert flag not in cli.deprecated, f"{name} {sets}: {flag} is deprecated in SGLang {version}"


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
    assert emitted["--cuda-graph-max-bs"] == "16" and "--api-key" not in emitted
    assert "--speculative-ddtree-trace" not in emitted and emitted["--speculative-ddtree-trace-max-mb"] == "1024"
    traced = dict(server_flags(load_profile("pcie-ep8", ["speculative.trace=/var/lib/k26-ddtree/t.bin",
                                                         "speculative.trace_max_mb=64"])))
    assert traced["--speculative-ddtree-trace"] == "/var/lib/k26-ddtree/t.bin"
    assert traced["--speculative-ddtree-trace-max-mb"] == "64"
    nvlink = dict(server_flags(load_profile("nvlink-tp8-nvls")))
    assert "--enable-nccl-nvls" in nvlink and "--ep-size" not in nvlink
    assert "--disable-cuda-graph" in dict(server_flags(load_profile("pcie-ep8", ["cuda_graph=false"])))


def test_sglang_0_5_17_gets_the_spellings_that_replace_its_deprecated_aliases():
    cli = for_version("0.5.17")
    assert {flag: cli.deprecated[flag] for flag in RESPELLED} == {
        "--cuda-graph-max-bs": "--cuda-graph-max-bs-decode",
        "--speculative-dflash-draft-window-size": "--speculative-draft-window-size",
        "--disable-cuda-graph": "--cuda-graph-backend-{decode,prefill}=disabled",
    }
    emitted = server_flags(load_profile("pcie-ep8", ["sglang_version=0.5.17"]))
    assert ("--cuda-graph-max-bs-decode", "16") in emitted and ("--speculative-draft-window-size", "2048") in emitted
    names = [flag for flag, _ in emitted]
    assert "--cuda-graph-max-bs" not in names and "--speculative-dflash-draft-window-size" not in names
    assert names.index("--speculative-draft-window-size") == names.index("--speculative-dflash-block-size") + 1
    off = [flag for flag, _ in server_flags(load_profile("pcie-ep8", ["sglang_version=0.5.17", "cuda_graph=false"]))]
    assert "--disable-cuda-graph" not in off
    assert off[off.index("--disable-decode-cuda-graph") + 1] == "--disable-prefill-cuda-graph"
    assert not {flag for flag in RESPELLED if flag in for_version("0.5.11").deprecated}, "0.5.11 spells them as keys do"


def test_a_key_flag_a_version_lacks_or_deprecates_without_a_spelling_is_refused():
    shipped = for_version("0.5.11")
    profile = load_profile("pcie-ep8")
    without_ep = ServerCli("9.9.9", tuple(g for g in shipped.options if "--ep-size" not in g), shipped.choices, {})
    assert spelling_problem(profile, without_ep) == ("parallel.ep_size", "sets --ep-size, which SGLang 9.9.9 does not have")
    renamed = ServerCli("9.9.9", shipped.options, shipped.choices, {"--tp-size": "--tp"})
    assert spelling_problem(profile, renamed) == (
        "parallel.tp_size", "sets --tp-size, which SGLang 9.9.9 deprecates (use --tp): k26-deploy cannot write it there")


@pytest.mark.parametrize("words, on_0_5_11, on_0_5_17", [
    (["--cuda-graph-max-bs-decode", "8"], "is not an SGLang 0.5.11 flag", "through its key cuda_graph_max_bs"),
    (["--cuda-graph-max-bs", "8"], "through its key cuda_graph_max_bs", "through its key cuda_graph_max_bs"),
    (["--disable-prefill-cuda-graph"], "is not an SGLang 0.5.11 flag", "through its key cuda_graph"),
    (["--speculative-draft-window", "4"], "is not an SGLang 0.5.11 flag", "its key speculative.draft_window_size"),
    (["--cuda-graph-config", "{}"], "is not an SGLang 0.5.11 flag", "is refused: --cuda-graph-config sets the"),
    (["--bf16-gemm-backend", "torch"], "is not an SGLang 0.5.11 flag", None),
    (["--cuda-graph-backend-prefill", "breakable"], "is not an SGLang 0.5.11 flag", None),
])
def test_extra_args_are_read_as_the_profiles_sglang_version_reads_them(tmp_path, words, on_0_5_11, on_0_5_17):
    for version, expected in (("0.5.11", on_0_5_11), ("0.5.17", on_0_5_17)):
        path = tmp_path / "extra.yaml"
        path.write_text(f"extends: pcie-ep8\nsglang_version: '{version}'\nextra_args: {json.dumps(words)}\n")
        proc = k26("render", "--allow-missing-model", "--no-verify", "--profile", str(path))
        if expected is None:
            assert proc.returncode == 0, proc.stderr
            assert " ".join(words) in proc.stdout.replace(" \\\n    ", " ")
        else:
            assert expected in one_line_error(proc), version


def test_each_shipped_profile_names_its_sglang_version_and_why():
    for name in shipped_names():
        text = (profiles_dir() / f"{name}.yaml").read_text(encoding="utf-8").splitlines()
        (line,) = [i for i, row in enumerate(text) if row.startswith("sglang_version:")]
        version = load_profile(name).sglang_version
        assert text[line] == f"sglang_version: {version}" and version in PINS
        why = []
        for row in reversed(text[:line]):
            if not row.startswith("#"):
                break
            why.insert(0, row)
        assert why and why[0].startswith(f"# SGLang {version}"), f"{name}: a comment above sglang_version says why"


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


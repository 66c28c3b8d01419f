"""SGLang's own parser against k26-deploy: its flag table, the flags profiles render, and extra_args.

The parser is `ServerArgs.add_cli_args` of the pinned wheel's sources with the patch set's
server_args.py in place, run in a subprocess, of the SGLang version this test process can
import (sglang_source.process_version: tests/run.sh runs this file in 0.5.17's venv too).
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from deploy_helpers import k26, one_line_error
from sglang_source import STUBS, patched_server_args, process_version

from k26_ddtree.deploy.flags import (
    REFUSED_FLAGS, RESPELLED, SERVER_FLAG_KEYS, is_secret_name, owned_flags, server_flags,
)
from k26_ddtree.deploy.profiles import load_profile, shipped_names
from k26_ddtree.deploy.schema import Profile
from k26_ddtree.deploy.sglang_cli import for_version
from k26_ddtree.deploy.values import dotted_keys

pytestmark = pytest.mark.network
VERSION = process_version()
CLI = for_version(VERSION)

# SGLang's own parser, as `sglang.launch_server` builds it. It reports its arguments (option strings,
# switch or not, choices, the deprecated ones' replacements), which of the `watched` flags' destinations
# each case's words set (None: argparse refuses the words or exits), and, for each pair in `same`,
# what each side means to SGLang: every parsed value, with those its CUDA-graph settings fold together
# (0.5.17's ServerArgs._parse_cuda_graph_config) replaced by the settings they resolve to.
REAL_PARSER = """
import argparse, contextlib, importlib.util, inspect, io, json, re, sys, types
import sglang.srt
spec = importlib.util.spec_from_file_location("sglang.srt.server_args", sys.argv[1])
module = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = module
spec.loader.exec_module(module)

def make_parser():
    parser = argparse.ArgumentParser(prog="sglang serve")
    module.ServerArgs.add_cli_args(parser)
    for action in parser._actions:
        action.required = False  # --model-path: the cases are extra_args alone
    return parser

request = json.load(sys.stdin)
parser = make_parser()
watched = [a for a in parser._actions if set(a.option_strings) & set(request["watched"])]
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

plain = make_parser()
fold = getattr(module.ServerArgs, "_parse_cuda_graph_config", None)
folded = set(re.findall(r"self\\.(\\w+)", inspect.getsource(fold))) if fold else set()

def meaning(words):
    values = vars(plain.parse_args(words))
    if fold:
        holder = types.SimpleNamespace(**values)
        fold(holder)
        values = {k: v for k, v in values.items() if k not in folded}
        values["cuda_graph_config"] = holder.cuda_graph_config.to_dict()
    return json.loads(json.dumps(values, default=str))

actions = [a for a in parser._actions]
print(json.dumps({
    "options": [a.option_strings for a in actions],
    "switches": {o: a.nargs == 0 for a in actions for o in a.option_strings},
    "choices": {o: list(a.choices) for a in actions if a.choices for o in a.option_strings},
    "deprecated": {o: getattr(a, "new_flag", None) or "" for a in actions
                   if type(a).__name__.startswith("Deprecated") for o in a.option_strings},
    "results": results,
    "same": [[meaning(old), meaning(new)] for old, new in request["same"]],
}))
"""

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
    # The spellings 0.5.17 took over from flags keys set, and the flags around them.
    ["--cuda-graph-max-bs-decode", "8"], ["--cuda-graph-max-bs-d", "8"], ["--cuda-graph-max-bs", "8"],
    ["--disable-decode-cuda-graph"], ["--disable-prefill"], ["--speculative-draft-window-size", "4"],
    ["--speculative-dflash-draft-window-size", "4"], ["--cuda-graph-config", "{}"],
    ["--cuda-graph-backend-prefill", "breakable"], ["--bf16-gemm-backend", "torch"], ["--cuda-graph-bs", "1", "2"],
]

# A value for each respelled flag (None: a switch).
RESPELLING_VALUES = {"--cuda-graph-max-bs": "16", "--speculative-dflash-draft-window-size": "2048",
                     "--disable-cuda-graph": None}


def _words(flags, value) -> list[str]:
    return [word for flag in flags for word in ([flag] if value is None else [flag, value])]


@pytest.fixture(scope="module")
def real_parser(pristine_sources, tmp_path_factory):
    watched = [o for group in CLI.options for o in group
               if o in owned_flags(CLI) or o in REFUSED_FLAGS or is_secret_name(o)]
    same = [[_words([old], value), _words(RESPELLED[old], value)]
            for old, value in RESPELLING_VALUES.items() if old in CLI.deprecated]
    request = {"watched": watched, "cases": EXTRA_CASES, "same": same}
    server_args = tmp_path_factory.mktemp("patched") / "server_args.py"
    server_args.write_text(patched_server_args(VERSION), encoding="utf-8")
    proc = subprocess.run([sys.executable, "-c", REAL_PARSER, str(server_args)], input=json.dumps(request),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(pristine_sources(VERSION)), str(STUBS)])})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "request": request}


def test_the_table_is_sglangs_own_parser(real_parser):
    assert sorted(map(tuple, real_parser["options"])) == sorted(CLI.options)
    assert {flag: real_parser["choices"][flag] for flag in CLI.choices} == {
        flag: list(choices) for flag, choices in CLI.choices.items()}
    assert real_parser["deprecated"] == dict(CLI.deprecated)
    assert {o for o in CLI.aliases if is_secret_name(o)} == {"--api-key", "--admin-api-key", "--ssl-keyfile-password"}
    for flag, key in owned_flags(CLI).items():
        assert flag in CLI.aliases and key in dotted_keys(Profile), (flag, key)
    assert set(owned_flags(CLI).values()) == set(SERVER_FLAG_KEYS.values())


@pytest.mark.parametrize("sets", VARIANTS, ids=VARIANT_IDS)
@pytest.mark.parametrize("name", shipped_names())
def test_profile_flags_take_what_sglangs_parser_takes(name, sets, real_parser):
    profile = dataclasses.replace(load_profile(name, sets), sglang_version=VERSION)
    for flag, value in server_flags(profile):
        assert flag in real_parser["switches"], f"{name} {sets}: {flag} is not an SGLang {VERSION} (+DDTree) flag"
        assert flag not in real_parser["deprecated"], f"{flag} is deprecated in SGLang {VERSION}"
        if real_parser["switches"][flag]:
            assert value is None, f"{flag} is a switch in SGLang but the profile gives it {value!r}"
            continue
        assert value is not None, f"{flag} takes a value in SGLang but the profile emits it bare"
        choices = real_parser["choices"].get(flag)
        if choices is not None:
            assert value in choices, f"{flag} {value!r} is not one of SGLang's choices {sorted(choices)}"


def test_each_respelling_means_to_sglang_what_the_deprecated_spelling_means(real_parser):
    assert set(RESPELLING_VALUES) == set(RESPELLED)
    assert len(real_parser["same"]) == sum(flag in CLI.deprecated for flag in RESPELLED)
    for (old, new), (old_meaning, new_meaning) in zip(real_parser["request"]["same"], real_parser["same"]):
        assert old_meaning == new_meaning, (old, new)


def test_extra_args_are_refused_exactly_when_sglang_would_set_an_owned_flag_or_refuse_them(real_parser, tmp_path):
    wrong = []
    for words, watched_set in zip(EXTRA_CASES, real_parser["results"]):
        path = tmp_path / "extra.yaml"
        path.write_text(f"extends: pcie-ep8\nsglang_version: '{VERSION}'\nextra_args: {json.dumps(words)}\n")
        proc = k26("render", "--allow-missing-model", "--no-verify", "--profile", str(path))
        if (proc.returncode == 0) != (watched_set == []):
            wrong.append((words, watched_set, proc.returncode, proc.stderr.strip()))
        elif proc.returncode != 0:
            one_line_error(proc)
    assert not wrong, f"k26-deploy and SGLang {VERSION}'s parser disagree:\n" + "\n".join(map(str, wrong))

"""The SGLang command lines a profile stands for: server flags and router flags.

Each flag is a (name, value) pair, value None for a switch and a list for a
flag that takes several words (the router's --worker-urls), so the unit template
can lay them out one per line and the tests can check every name and value
against the pinned SGLang argument parser.
"""

from __future__ import annotations

from k26_ddtree.deploy.profiles import Profile

Flag = tuple[str, "str | list[str] | None"]

# systemd expands this from EnvironmentFile= at start; the key never lands in the unit file.
API_KEY_REFERENCE = "${K26_API_KEY}"


def server_flags(profile: Profile) -> list[Flag]:
    d = profile.data
    par, spec = d["parallel"], d["speculative"]
    flags: list[Flag] = [
        ("--model-path", d["model"]),
        ("--served-model-name", d["served_model_name"]),
        ("--host", d["host"]),
        ("--port", str(d["port"])),
    ]
    if d["trust_remote_code"]:
        flags.append(("--trust-remote-code", None))
    flags.append(("--tp-size", str(par["tp_size"])))
    if par["ep_size"] is not None:
        flags.append(("--ep-size", str(par["ep_size"])))
    if par["moe_a2a_backend"] is not None:
        flags.append(("--moe-a2a-backend", par["moe_a2a_backend"]))
    if par["enable_nccl_nvls"]:
        flags.append(("--enable-nccl-nvls", None))
    if par["nnodes"] > 1:
        flags += [
            ("--nnodes", str(par["nnodes"])),
            ("--node-rank", str(par["node_rank"])),
            ("--dist-init-addr", par["dist_init_addr"]),
        ]
    flags += [
        ("--attention-backend", d["attention_backend"]),
        ("--speculative-algorithm", spec["algorithm"]),
        ("--speculative-draft-model-path", d["drafter"]),
        ("--speculative-dflash-block-size", str(spec["block_size"])),
        ("--speculative-dflash-draft-window-size", str(spec["draft_window_size"])),
    ]
    if spec["algorithm"] == "DDTREE":
        flags += [
            ("--speculative-ddtree-budget", str(spec["budget"])),
            ("--speculative-ddtree-topk", str(spec["topk"])),
        ]
        if spec["spine"]:
            flags.append(("--speculative-ddtree-spine", None))
    if d["cuda_graph"]:
        flags.append(("--cuda-graph-max-bs", str(d["cuda_graph_max_bs"])))
    else:
        flags.append(("--disable-cuda-graph", None))
    for key, flag in (
        ("mem_fraction_static", "--mem-fraction-static"),
        ("context_length", "--context-length"),
        ("max_running_requests", "--max-running-requests"),
        ("tool_call_parser", "--tool-call-parser"),
        ("reasoning_parser", "--reasoning-parser"),
    ):
        if d[key] is not None:
            flags.append((flag, str(d[key])))
    if d["skip_server_warmup"]:
        flags.append(("--skip-server-warmup", None))
    if d["enable_metrics"]:
        flags.append(("--enable-metrics", None))
    if d["api_key"]:
        flags.append(("--api-key", API_KEY_REFERENCE))
    return flags + _split_extra(d["extra_args"])


def router_flags(profile: Profile) -> list[Flag]:
    router = profile.data["router"]
    return [
        ("--worker-urls", list(router["worker_urls"])),
        ("--host", router["host"]),
        ("--port", str(router["port"])),
        ("--policy", router["policy"]),
    ]


def _split_extra(args: list[str]) -> list[Flag]:
    """extra_args as pairs: a flag followed by a non-flag token takes it as its value."""
    pairs: list[Flag] = []
    for token in args:
        if pairs and not token.startswith("--") and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], token)
        else:
            pairs.append((token, None))
    return pairs

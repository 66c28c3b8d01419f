"""The SGLang command lines a profile stands for: server flags and router flags.

Each flag is a (name, value) pair, value None for a switch and a list for a
flag that takes several words (the router's --worker-urls), so the unit template
can lay them out one per line and the tests can check every name and value
against the pinned SGLang argument parser.
"""

from __future__ import annotations

from k26_ddtree.deploy.schema import Profile

Flag = tuple[str, "str | list[str] | None"]

# systemd expands this from EnvironmentFile= at start; the key never lands in the unit file.
API_KEY_REFERENCE = "${K26_API_KEY}"
# The router release router_flags() is written for (tests/deploy parse them with its own parser):
# its --api-key is required from clients and sent on to the workers.
ROUTER_PACKAGE = "sglang-router==0.3.2"


def server_flags(profile: Profile) -> list[Flag]:
    par, spec = profile.parallel, profile.speculative
    flags: list[Flag] = [
        ("--model-path", profile.model),
        ("--served-model-name", profile.served_model_name),
        ("--host", profile.host),
        ("--port", str(profile.port)),
    ]
    if profile.trust_remote_code:
        flags.append(("--trust-remote-code", None))
    flags.append(("--tp-size", str(par.tp_size)))
    if par.ep_size is not None:
        flags.append(("--ep-size", str(par.ep_size)))
    if par.moe_a2a_backend is not None:
        flags.append(("--moe-a2a-backend", par.moe_a2a_backend))
    if par.enable_nccl_nvls:
        flags.append(("--enable-nccl-nvls", None))
    if par.nnodes > 1:
        flags += [
            ("--nnodes", str(par.nnodes)),
            ("--node-rank", str(par.node_rank)),
            ("--dist-init-addr", par.dist_init_addr),
        ]
    flags += [
        ("--attention-backend", profile.attention_backend),
        ("--speculative-algorithm", spec.algorithm),
        ("--speculative-draft-model-path", profile.drafter),
        ("--speculative-dflash-block-size", str(spec.block_size)),
        ("--speculative-dflash-draft-window-size", str(spec.draft_window_size)),
    ]
    if spec.algorithm == "DDTREE":
        flags += [
            ("--speculative-ddtree-budget", str(spec.budget)),
            ("--speculative-ddtree-topk", str(spec.topk)),
        ]
        if spec.spine:
            flags.append(("--speculative-ddtree-spine", None))
    if profile.cuda_graph:
        flags.append(("--cuda-graph-max-bs", str(profile.cuda_graph_max_bs)))
    else:
        flags.append(("--disable-cuda-graph", None))
    for value, flag in (
        (profile.mem_fraction_static, "--mem-fraction-static"),
        (profile.context_length, "--context-length"),
        (profile.max_running_requests, "--max-running-requests"),
        (profile.tool_call_parser, "--tool-call-parser"),
        (profile.reasoning_parser, "--reasoning-parser"),
    ):
        if value is not None:
            flags.append((flag, str(value)))
    if profile.skip_server_warmup:
        flags.append(("--skip-server-warmup", None))
    if profile.enable_metrics:
        flags.append(("--enable-metrics", None))
    if profile.api_key:
        flags.append(("--api-key", API_KEY_REFERENCE))
    return flags + _split_extra(profile.extra_args)


def router_flags(profile: Profile) -> list[Flag]:
    router = profile.router
    flags: list[Flag] = [
        ("--worker-urls", list(router.worker_urls)),
        ("--host", router.host),
        ("--port", str(router.port)),
        ("--policy", router.policy),
    ]
    if profile.api_key:
        flags.append(("--api-key", API_KEY_REFERENCE))
    return flags


def _split_extra(args: tuple[str, ...]) -> list[Flag]:
    """extra_args as pairs: a flag followed by a non-flag token takes it as its value."""
    pairs: list[Flag] = []
    for token in args:
        if pairs and not token.startswith("--") and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], token)
        else:
            pairs.append((token, None))
    return pairs

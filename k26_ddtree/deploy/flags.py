"""The SGLang command lines a profile stands for: server flags and router flags.

Each flag is a (name, value) pair, value None for a switch and a list for a
flag that takes several words (the router's --worker-urls), so the unit template
can lay them out one per line and the tests can check every name and value
against the pinned SGLang argument parser.

Flags are written for the profile's SGLang version (sglang_version): keys set flags
as SERVER_FLAG_KEYS spells them (SGLang 0.5.11's spelling), and a version that keeps
one only as a deprecated alias gets the words that replace it (RESPELLED). extra_args go through
extra_args_problem(), which reads them the way that version's argparse does (its
table in sglang_cli): they may add flags but not override one a key sets, however
spelled, nor carry a secret.
"""

from __future__ import annotations

import difflib
import re

from k26_ddtree.deploy.schema import Profile
from k26_ddtree.deploy.sglang_cli import ServerCli, for_version

Flag = tuple[str, "str | list[str] | None"]

# systemd expands this from EnvironmentFile= at start; the key never lands in the unit file.
API_KEY_REFERENCE = "${K26_API_KEY}"
# The router release router_flags() is written for (tests/deploy parse them with its own parser):
# its --api-key is required from clients and sent on to the workers.
ROUTER_PACKAGE = "sglang-router==0.3.2"
# Its --policy choices.
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "manual")

# Every flag server_flags() can write, with the profile key that sets it. extra_args may not set
# one of them in any spelling: a second --host after ours would win, past the API-key check.
SERVER_FLAG_KEYS = {
    "--model-path": "model",
    "--served-model-name": "served_model_name",
    "--host": "host",
    "--port": "port",
    "--trust-remote-code": "trust_remote_code",
    "--tp-size": "parallel.tp_size",
    "--ep-size": "parallel.ep_size",
    "--moe-a2a-backend": "parallel.moe_a2a_backend",
    "--enable-nccl-nvls": "parallel.enable_nccl_nvls",
    "--nnodes": "parallel.nnodes",
    "--node-rank": "parallel.node_rank",
    "--dist-init-addr": "parallel.dist_init_addr",
    "--attention-backend": "attention_backend",
    "--speculative-algorithm": "speculative.algorithm",
    "--speculative-draft-model-path": "drafter",
    "--speculative-dflash-block-size": "speculative.block_size",
    "--speculative-dflash-draft-window-size": "speculative.draft_window_size",
    "--speculative-ddtree-budget": "speculative.budget",
    "--speculative-ddtree-topk": "speculative.topk",
    "--speculative-ddtree-budget-schedule": "speculative.schedule",
    "--speculative-ddtree-spine": "speculative.spine",
    "--speculative-ddtree-trace": "speculative.trace",
    "--speculative-ddtree-trace-max-mb": "speculative.trace_max_mb",
    "--cuda-graph-max-bs": "cuda_graph_max_bs",
    "--disable-cuda-graph": "cuda_graph",
    "--mem-fraction-static": "mem_fraction_static",
    "--context-length": "context_length",
    "--max-running-requests": "max_running_requests",
    "--tool-call-parser": "tool_call_parser",
    "--reasoning-parser": "reasoning_parser",
    "--skip-server-warmup": "skip_server_warmup",
    "--enable-metrics": "enable_metrics",
    "--api-key": "api_key",
}
ROUTER_FLAG_KEYS = {
    "--worker-urls": "router.worker_urls",
    "--host": "router.host",
    "--port": "router.port",
    "--policy": "router.policy",
    "--api-key": "api_key",
}
# How a version that keeps a flag of SERVER_FLAG_KEYS only as a deprecated alias spells it: the words
# that mean the same there, each taking the flag's value (none for a switch). tests/deploy parse both
# spellings with that version's own parser.
RESPELLED = {
    "--cuda-graph-max-bs": ("--cuda-graph-max-bs-decode",),
    "--speculative-dflash-draft-window-size": ("--speculative-draft-window-size",),
    # SGLang's notice says --cuda-graph-backend-{decode,prefill}=disabled: the per-phase switches set the
    # same, and leave --cuda-graph-backend-* to extra_args.
    "--disable-cuda-graph": ("--disable-decode-cuda-graph", "--disable-prefill-cuda-graph"),
}
# SGLang flags extra_args may not carry although no key sets them, and why.
REFUSED_FLAGS = {
    "--config": "reads further flags from a file, past every check of the profile",
    "--cuda-graph-config": "sets the CUDA graphs past the keys cuda_graph and cuda_graph_max_bs (its JSON wins "
                           "over every flag)",
    "--help": "prints the usage and exits instead of serving",
}
# A flag or variable whose name ends in one of these words carries a secret (--api-key,
# --ssl-keyfile-password, HF_TOKEN): in the unit file, which every user may read, it would be plain text.
SECRET_WORDS = ("key", "token", "secret", "password")
# SGLang's flags that end in "token" but count text tokens.
TEXT_TOKEN_FLAGS = ("--bucket-time-to-first-token", "--kt-max-deferred-experts-per-token")
# What argparse takes for a value although it starts with "-" (a parser without negative-number options).
_NEGATIVE_NUMBER = re.compile(r"-\d+|-\d*\.\d+")


def server_flags(profile: Profile) -> list[Flag]:
    return keyed_server_flags(profile) + _split_extra(profile.extra_args)


def keyed_server_flags(profile: Profile) -> list[Flag]:
    """The server flags profile keys set (all but extra_args), as the profile's SGLang version spells them."""
    cli = for_version(profile.sglang_version)
    return [(word, value) for flag, value in _keyed(profile) for word in _spelling(flag, cli)]


def owned_flags(cli: ServerCli) -> dict[str, str]:
    """Each flag a profile key sets in SGLang `cli.version`, in every spelling it renders -> that key."""
    return {word: key for flag, key in SERVER_FLAG_KEYS.items()
            for word in {flag, *_spelling(flag, cli)} if word in cli.aliases}


def spelling_problem(profile: Profile, cli: ServerCli) -> tuple[str, str] | None:
    """(key, why) for the first flag the profile's keys set that SGLang `cli.version` has no spelling of."""
    for flag, _ in _keyed(profile):
        key = SERVER_FLAG_KEYS[flag]
        if flag in cli.deprecated and flag not in RESPELLED:
            notice = f"use {cli.deprecated[flag]}" if cli.deprecated[flag] else "with no replacement"
            return key, (f"sets {flag}, which SGLang {cli.version} deprecates ({notice}): k26-deploy cannot write "
                         "it there")
        for word in _spelling(flag, cli):
            if word not in cli.aliases:
                return key, f"sets {word}, which SGLang {cli.version} does not have"
    return None


def _spelling(flag: str, cli: ServerCli) -> tuple[str, ...]:
    return RESPELLED[flag] if flag in cli.deprecated and flag in RESPELLED else (flag,)


def _keyed(profile: Profile) -> list[Flag]:
    """The flags keys set, spelled as SERVER_FLAG_KEYS names them."""
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
        if spec.schedule is None:
            flags += [
                ("--speculative-ddtree-budget", str(spec.budget)),
                ("--speculative-ddtree-topk", str(spec.topk)),
            ]
        else:
            flags.append(("--speculative-ddtree-budget-schedule", spec.schedule))
        if spec.spine:
            flags.append(("--speculative-ddtree-spine", None))
        if spec.trace is not None:
            flags.append(("--speculative-ddtree-trace", spec.trace))
        # The cap holds however tracing is turned on (the flag, or K26_DDTREE_TRACE in environment).
        flags.append(("--speculative-ddtree-trace-max-mb", str(spec.trace_max_mb)))
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
    return flags


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


def extra_args_problem(args: tuple[str, ...], cli: ServerCli) -> str | None:
    """Why extra_args would set, to the parser of SGLang `cli.version`, a flag the profile owns, a secret or a
    refused flag, or hold a word it takes for no flag at all; None when they are fine.

    A word starting with "-" is read the way argparse reads it: its name before any "=", an exact
    option string (or alias), else the one option that name is a prefix of (allow_abbrev is on).
    """
    aliases, owned = cli.aliases, owned_flags(cli)
    for word in args:
        if word == "-" or _NEGATIVE_NUMBER.fullmatch(word) or not word.startswith("-"):
            continue  # a value
        entry = f"entry {word!r}"
        name = word.partition("=")[0]
        if not name.startswith("--") or len(name) == 2:
            return f"{entry} is not an SGLang flag (those are --name)"
        found = [name] if name in aliases else [o for o in aliases if o.startswith(name)]
        if not found:
            close = difflib.get_close_matches(name, list(aliases), n=1)
            return f"{entry} is not an SGLang {cli.version} flag" + (f" (did you mean {close[0]}?)" if close else "")
        if len(found) > 1:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            return f"{entry}: {name} is ambiguous to SGLang's parser ({shown}); spell the flag out"
        if found[0] != name:
            entry += f" (SGLang reads {name} as {found[0]})"
        for alias in aliases[found[0]]:
            key = owned.get(alias)
            if key == "api_key":
                return (f"{entry} sets the API key, which would be plain text in the unit file: set api_key: true "
                        "instead (the key then comes from K26_API_KEY in env_file, mode 0600)")
            if key is not None:
                return f"{entry} sets {alias}, which the profile sets through its key {key}: set {key} instead"
            if alias in REFUSED_FLAGS:
                return f"{entry} is refused: {alias} {REFUSED_FLAGS[alias]}"
            if is_secret_name(alias):
                return f"{entry} sets a secret ({alias}), which would be plain text in the unit file"
    return None


def is_secret_name(name: str) -> bool:
    """Whether a flag (--api-key) or variable (HF_TOKEN) name ends in a word that means a secret."""
    return name not in TEXT_TOKEN_FLAGS and re.split(r"[-_]", name.lower())[-1] in SECRET_WORDS

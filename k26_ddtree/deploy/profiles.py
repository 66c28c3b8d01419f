"""Hardware profiles: load a YAML profile, resolve `extends:`, apply `--set`, validate.

A profile is a base plus overrides. Shipped profiles live in deploy/profiles/
(found through k26_ddtree.resources); a user's own YAML may extend a shipped
name or another file. The keys, their types and defaults are the dataclasses of
k26_ddtree.deploy.schema; this module adds what types alone cannot say (ranges,
relations between keys, the SGLang version and its choices, addresses and URLs),
and that no value reaches a command line as a flag of its own. Every mistake is a
UserError naming the file and the key, never a traceback.
"""

from __future__ import annotations

import copy
import dataclasses
import ipaddress
import json
import re
import sys
from pathlib import Path
from urllib.parse import urlsplit

from k26_ddtree import jsonread
from k26_ddtree.core import budget, schedule
from k26_ddtree.deploy import pairings, values
from k26_ddtree.deploy.flags import (
    ROUTER_FLAG_KEYS, ROUTER_POLICIES, extra_args_problem, is_secret_name, keyed_server_flags, owned_flags,
    router_flags, spelling_problem,
)
from k26_ddtree.deploy.schema import Profile, Speculative, keys
from k26_ddtree.deploy.sglang_cli import for_version
from k26_ddtree.deploy.yamlread import read_yaml
from k26_ddtree.errors import UserError
from k26_ddtree.repro.sglang_versions import PINS, known
from k26_ddtree.resources import data_path

ALGORITHMS = ("DDTREE", "DFLASH")
# The one backend whose verify applies DDTree's tree mask (k26_ddtree.sglang.common.args, which imports torch).
DDTREE_ATTENTION_BACKEND = "triton"
# One RFC 1123 host name label.
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def profiles_dir() -> Path:
    return data_path("deploy", "profiles")


def shipped_names() -> list[str]:
    """The hardware profiles (base.yaml is only something to extend)."""
    return sorted(p.stem for p in profiles_dir().glob("*.yaml") if p.stem != "base")


def hardware_names(profile: Profile) -> list[str]:
    """The shipped profiles `profile` is or extends: the hardware it is written for."""
    shipped = profiles_dir().resolve()
    return [Path(source).stem for source in profile.sources if Path(source).resolve().parent == shipped]


def load_profile(ref: str, sets: list[str] | None = None) -> Profile:
    """Resolve `ref` (a shipped name or a .yaml path), its `extends:` chain and `--set` overrides."""
    path = _locate(ref, base_dir=Path.cwd())
    data, sources = _load_chain(path, seen=[])
    for assignment in sets or []:
        values.apply_set(data, assignment, Profile)
    return _finish(path.stem, data, sources)


def with_sets(profile: Profile, sets: list[str]) -> Profile:
    """A copy of `profile` with `--set` overrides applied and everything validated again."""
    data = values.to_data(profile)
    for assignment in sets:
        values.apply_set(data, assignment, Profile)
    return _finish(profile.name, data, list(profile.sources))


def to_json(profile: Profile) -> str:
    """The profile as the one JSON line a unit carries (read back by profile_from_json)."""
    return json.dumps({"name": profile.name, "sources": list(profile.sources), "data": values.to_data(profile)},
                      sort_keys=True)


def profile_from_json(text: str, origin: str) -> Profile:
    try:
        raw = jsonread.parse_json(text, "it")
        name, data, sources = raw["name"], raw["data"], [str(s) for s in raw.get("sources", [])]
        if not isinstance(name, str) or not isinstance(data, dict):
            raise TypeError("name or data of the wrong type")
    except (jsonread.Unreadable, KeyError, TypeError) as err:
        raise UserError(f"{origin}: the embedded profile is unreadable ({err}); re-install the unit") from None
    return _finish(name, data, sources, origin, fill_missing=True)


def _finish(name: str, data: dict, sources: list[str], origin: str | None = None,
            fill_missing: bool = False) -> Profile:
    origin = origin or f"profile {name}"
    profile = values.build(Profile, data, origin, fill_missing=fill_missing, name=name, sources=tuple(sources))
    if profile.python is None:
        # The venv that runs k26-deploy is the one that has SGLang and this toolkit.
        profile = dataclasses.replace(profile, python=sys.executable)
    check_values(profile, origin)
    if profile.speculative.schedule is not None:
        # One spelling reaches the unit however the schedule was typed (check_values parsed it).
        spec = dataclasses.replace(profile.speculative, schedule=schedule.normal(profile.speculative.schedule))
        profile = dataclasses.replace(profile, speculative=spec)
    return profile


def check_values(profile: Profile, origin: str) -> None:
    """Ranges and relations between keys that types alone cannot express."""
    par, svc = profile.parallel, profile.service

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{origin}: {key} {why}")

    _check_sglang_version(profile, origin)
    if not 1 <= profile.port <= 65535:
        raise bad("port", f"must be 1..65535, got {profile.port}")
    if not 1 <= profile.router.port <= 65535:
        raise bad("router.port", f"must be 1..65535, got {profile.router.port}")
    _check_speculative(profile.speculative, bad)
    for key in ("tp_size", "nnodes"):
        if getattr(par, key) < 1:
            raise bad(f"parallel.{key}", f"must be >= 1, got {getattr(par, key)}")
    if par.ep_size is not None and (par.ep_size < 1 or par.tp_size % par.ep_size):
        raise bad("parallel.ep_size", f"must divide parallel.tp_size ({par.tp_size}), got {par.ep_size}")
    if not 0 <= par.node_rank < par.nnodes:
        raise bad("parallel.node_rank", f"must be in 0..nnodes-1 ({par.nnodes - 1}), got {par.node_rank}")
    if par.nnodes > 1 and not par.dist_init_addr:
        raise bad("parallel.dist_init_addr", "is required when parallel.nnodes > 1 (HOST:PORT of node 0)")
    if profile.cuda_graph_max_bs < 1:
        raise bad("cuda_graph_max_bs", f"must be >= 1, got {profile.cuda_graph_max_bs}")
    if profile.mem_fraction_static is not None and not 0 < profile.mem_fraction_static < 1:
        raise bad("mem_fraction_static", f"must be between 0 and 1, got {profile.mem_fraction_static}")
    for key in ("context_length", "max_running_requests"):
        if getattr(profile, key) is not None and getattr(profile, key) < 1:
            raise bad(key, f"must be >= 1 or null, got {getattr(profile, key)}")
    for key, kind in keys(type(svc)).items():
        if kind.name == "int" and getattr(svc, key) < 1:
            raise bad(f"service.{key}", f"must be >= 1, got {getattr(svc, key)}")
    _check_addresses(profile, bad)
    _check_choices(profile, bad)
    _check_command_lines(profile, bad)


def _check_sglang_version(profile: Profile, origin: str) -> None:
    """A version k26-ddtree installs, not known to fail on the profile's hardware."""
    version = profile.sglang_version
    if version not in PINS:
        raise UserError(f"{origin}: sglang_version must be one of {known()}, got {version!r}")
    problem = pairings.refusal(version, hardware_names(profile))
    if problem:
        raise UserError(f"{origin}: sglang_version {version}: {problem}")


def _check_command_lines(profile: Profile, bad) -> None:
    """No flag hidden in a value, none that extra_args must not set, no secret in the unit file."""
    for name in profile.environment:
        if is_secret_name(name):
            raise bad(f"environment.{name}", "looks like a secret, which would be plain text in the unit file: "
                                             "put it in env_file (mode 0600) instead")
    extra = profile.extra_args
    if extra and not extra[0].startswith("--"):
        raise bad("extra_args", f"must start with a --flag, got {extra[0]!r}")
    cli = for_version(profile.sglang_version)
    problem = extra_args_problem(extra, cli)
    if problem:
        raise bad("extra_args", problem)
    unspellable = spelling_problem(profile, cli)
    if unspellable:
        raise bad(*unspellable)
    # Whatever a key holds, no value of it may reach a command line as a flag of its own.
    for flags, owners in ((keyed_server_flags(profile), owned_flags(cli)), (router_flags(profile), ROUTER_FLAG_KEYS)):
        for flag, value in flags:
            for word in [value] if isinstance(value, str) else value or []:
                if word.startswith("-"):
                    raise bad(owners[flag], f"must not start with '-' (it would reach {flag} as a flag), got {word!r}")


def _check_addresses(profile: Profile, bad) -> None:
    for key, host in (("host", profile.host), ("router.host", profile.router.host)):
        problem = _host_problem(host)
        if problem:
            raise bad(key, f"{problem}, got {host!r}")
    addr = profile.parallel.dist_init_addr
    if addr is not None:
        problem = _host_port_problem(addr)
        if problem:
            raise bad("parallel.dist_init_addr", f"must be HOST:PORT or [IPv6]:PORT ({problem}), got {addr!r}")
    for url in profile.router.worker_urls:
        problem = _base_url_problem(url)
        if problem:
            raise bad("router.worker_urls", f"entry {url!r} {problem}")


def _check_choices(profile: Profile, bad) -> None:
    choices = for_version(profile.sglang_version).choices
    if profile.speculative.algorithm == "DDTREE" and profile.attention_backend != DDTREE_ATTENTION_BACKEND:
        raise bad("attention_backend", f"must be {DDTREE_ATTENTION_BACKEND} with speculative.algorithm DDTREE "
                                       f"(its tree verify needs a tree mask), got {profile.attention_backend!r}")
    for key, value, choices in (
        ("attention_backend", profile.attention_backend, choices["--attention-backend"]),
        ("parallel.moe_a2a_backend", profile.parallel.moe_a2a_backend, choices["--moe-a2a-backend"]),
        ("tool_call_parser", profile.tool_call_parser, choices["--tool-call-parser"]),
        ("reasoning_parser", profile.reasoning_parser, choices["--reasoning-parser"]),
        ("router.policy", profile.router.policy, ROUTER_POLICIES),
    ):
        if value is not None and value not in choices:
            raise bad(key, f"must be one of {', '.join(choices)}, got {value!r}")


def _host_problem(host: str) -> str | None:
    """Why `host` is neither an IP address nor an RFC 1123 host name; None when it is one."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        labels = host.split(".")
        # RFC 1123 2.1: a name's last label is never all digits, so 999.1.1.1 is a bad address, not a name.
        if len(host) <= 253 and all(map(_LABEL.fullmatch, labels)) and not labels[-1].isdigit():
            return None
        return "must be an IP address or an RFC 1123 host name (letters, digits, inner '-', dots)"
    if getattr(address, "scope_id", None):
        return "must be an IP address without a %zone (the readiness URL cannot carry one as written)"
    return None


def _host_port_problem(addr: str) -> str | None:
    """SGLang's own HOST:PORT reading (NetworkAddress.parse): IPv6 in brackets, else split at the last ':'."""
    if addr.startswith("["):
        host, sep, port = addr[1:].partition("]:")
        if not sep or ":" not in host:
            return "[IPv6] then :PORT"
    else:
        host, sep, port = addr.rpartition(":")
        if not sep or ":" in host:
            return "IPv6 needs brackets" if ":" in host else "no :PORT"
    if not (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535):
        return "PORT must be 1..65535"
    problem = _host_problem(host)
    return f"HOST {problem}" if problem else None


def _base_url_problem(url: str) -> str | None:
    try:
        parts = urlsplit(url)
        port = parts.port  # raises ValueError for a port that is not a number in range
    except ValueError as err:
        return f"is not a valid URL ({err})"
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        return "must be an http(s) URL with a host, e.g. http://node1:30000"
    if parts.username is not None or parts.password is not None:
        return "must not carry a user or password (it would be plain text in the unit file)"
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        return "must be a base URL, http(s)://HOST[:PORT], without a path or query"
    problem = _host_problem(parts.hostname)
    return f"has a host that {problem}" if problem else None


def _check_speculative(spec: Speculative, bad) -> None:
    if spec.algorithm not in ALGORITHMS:
        raise bad("speculative.algorithm", f"must be one of {', '.join(ALGORITHMS)}, got {spec.algorithm!r}")
    if spec.block_size < 2:
        raise bad("speculative.block_size", f"must be >= 2, got {spec.block_size}")
    if spec.draft_window_size < spec.block_size:
        raise bad("speculative.draft_window_size", "must be >= speculative.block_size")
    if spec.topk < 1:
        raise bad("speculative.topk", f"must be >= 1, got {spec.topk}")
    if spec.budget < 1:
        raise bad("speculative.budget", f"must be >= 1, got {spec.budget}")
    if spec.trace is not None and spec.algorithm != "DDTREE":
        raise bad("speculative.trace", "needs speculative.algorithm DDTREE (the server traces DDTree steps only)")
    if spec.trace_max_mb < 1:
        raise bad("speculative.trace_max_mb", f"must be >= 1, got {spec.trace_max_mb}")
    problem = budget.tree_problem(spec.block_size - 1, spec.topk, spec.budget)
    if problem is not None:
        setting, why = problem
        raise bad(f"speculative.{setting}", why)
    if spec.schedule is not None:
        if spec.algorithm != "DDTREE":
            raise bad("speculative.schedule", "needs speculative.algorithm DDTREE (a schedule of DDTree trees)")
        try:
            schedule.parse_checked(spec.schedule, spec.block_size)
        except schedule.ScheduleError as err:
            raise bad("speculative.schedule", f"{spec.schedule!r}: {err}") from None


def _locate(ref: str, base_dir: Path) -> Path:
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = (base_dir / ref).resolve()
        if path.is_dir():
            raise UserError(f"profile {path} is a directory, not a YAML file")
        if not path.is_file():
            raise UserError(f"profile file not found: {path}" if not path.exists()
                            else f"profile {path} is not a regular file")
        return path
    shipped = profiles_dir() / f"{ref}.yaml"
    if not shipped.is_file():
        raise UserError(
            f"unknown profile {ref!r}; shipped profiles: {', '.join(shipped_names())} (or give a path to a .yaml file)"
        )
    return shipped


def _load_chain(path: Path, seen: list[Path]) -> tuple[dict, list[str]]:
    if path in seen:
        chain = " -> ".join(p.name for p in [*seen, path])
        raise UserError(f"profile {path}: 'extends' forms a cycle ({chain})")
    raw = read_yaml(path)
    parent_ref = raw.pop("extends", None)
    origin = f"profile {path}"
    values.check_partial(raw, Profile, origin)
    if parent_ref is None:
        return raw, [str(path)]
    if not isinstance(parent_ref, str) or not parent_ref:
        raise UserError(f"{origin}: 'extends' must be a profile name or a path, got {parent_ref!r}")
    try:
        parent_path = _locate(parent_ref, base_dir=path.parent)
    except UserError as err:
        raise UserError(f"{origin}: extends: {err}") from None
    parent, sources = _load_chain(parent_path, [*seen, path])
    return _merge(parent, raw), [*sources, str(path)]


def _merge(base: dict, over: dict) -> dict:
    """Nested mappings merge key by key; every other value (lists too) replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out

"""Hardware profiles: load a YAML profile, resolve `extends:`, apply `--set`, validate.

A profile is a base plus overrides. Shipped profiles live in deploy/profiles/
(found through k26_ddtree.resources); a user's own YAML may extend a shipped
name or another file. The keys, their types and defaults are the dataclasses of
k26_ddtree.deploy.schema; this module adds what types alone cannot say (ranges,
relations between keys). Every mistake is a UserError naming the file and the
key, never a traceback.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

from k26_ddtree.core import budget
from k26_ddtree.deploy import values
from k26_ddtree.deploy.schema import Profile, Speculative, keys
from k26_ddtree.deploy.yamlread import read_yaml
from k26_ddtree.errors import UserError
from k26_ddtree.resources import data_path

ALGORITHMS = ("DDTREE", "DFLASH")


def profiles_dir() -> Path:
    return data_path("deploy", "profiles")


def shipped_names() -> list[str]:
    """The hardware profiles (base.yaml is only something to extend)."""
    return sorted(p.stem for p in profiles_dir().glob("*.yaml") if p.stem != "base")


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
        raw = json.loads(text)
        name, data, sources = raw["name"], raw["data"], [str(s) for s in raw.get("sources", [])]
        if not isinstance(name, str) or not isinstance(data, dict):
            raise TypeError("name or data of the wrong type")
    except (ValueError, KeyError, TypeError, RecursionError) as err:
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
    return profile


def check_values(profile: Profile, origin: str) -> None:
    """Ranges and relations between keys that types alone cannot express."""
    par, svc = profile.parallel, profile.service

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{origin}: {key} {why}")

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
    for key, kind in keys(type(svc)).items():
        if kind.name == "int" and getattr(svc, key) < 1:
            raise bad(f"service.{key}", f"must be >= 1, got {getattr(svc, key)}")
    extra = profile.extra_args
    if extra and not extra[0].startswith("--"):
        raise bad("extra_args", f"must start with a --flag, got {extra[0]!r}")
    for arg in extra:
        if arg.startswith("--speculative-ddtree") or arg in ("--port", "--host", "--model-path"):
            raise bad("extra_args", f"must not carry {arg}: set it through its profile key")


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
    depth = spec.block_size - 1
    limit = budget.max_budget(depth, spec.topk)
    if spec.budget > limit:
        raise bad(
            "speculative.budget",
            f"{spec.budget} is larger than a tree of topk {spec.topk} and block {spec.block_size} "
            f"can hold (at most {limit} = sum of topk^d for d = 1..block-1)",
        )
    if not budget.codes_fit(depth, spec.topk, spec.budget):
        raise bad(
            "speculative.topk",
            f"{spec.topk} is too wide for a tree of {min(depth, spec.budget)} levels "
            "(the tree builder needs max(topk, 2)^min(block-1, budget) <= 2^30); lower topk or the budget",
        )


def _locate(ref: str, base_dir: Path) -> Path:
    if ref.endswith((".yaml", ".yml")) or "/" in ref:
        path = (base_dir / ref).resolve()
        if not path.is_file():
            raise UserError(f"profile file not found: {path}")
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

"""Hardware profiles: load a YAML profile, resolve `extends:`, apply `--set`, validate.

A profile is a base plus overrides. Shipped profiles live in deploy/profiles/
(found through k26_ddtree.resources); a user's own YAML may extend a shipped
name or another file. The schema below is the single source of truth for keys
and types; deploy/profiles/base.yaml documents it for humans.
Every mistake is a UserError naming the file and the key, never a traceback.
"""

from __future__ import annotations

import copy
import difflib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from k26_ddtree.core import budget
from k26_ddtree.errors import UserError
from k26_ddtree.resources import data_path

ALGORITHMS = ("DDTREE", "DFLASH")


@dataclass(frozen=True)
class Kind:
    """The type of one profile key: a name and whether null is allowed."""

    name: str  # str, path (absolute), int, float, bool, list (of str), map (str -> str)
    nullable: bool = False


# Short names keep SCHEMA readable as a table; a trailing 0 means "may be null".
S, P, I, B = Kind("str"), Kind("path"), Kind("int"), Kind("bool")
S0, P0, I0, F0 = Kind("str", True), Kind("path", True), Kind("int", True), Kind("float", True)
LIST, MAP = Kind("list"), Kind("map")

SCHEMA: dict = {
    "description": S,
    "python": P0,
    "model": P,
    "drafter": P,
    "served_model_name": S,
    "host": S,
    "port": I,
    "api_key": B,
    "env_file": P,
    "environment": MAP,
    "parallel": {
        "tp_size": I,
        "ep_size": I0,
        "moe_a2a_backend": S0,
        "enable_nccl_nvls": B,
        "nnodes": I,
        "node_rank": I,
        "dist_init_addr": S0,
    },
    "speculative": {
        "algorithm": S,
        "block_size": I,
        "draft_window_size": I,
        "budget": I,
        "topk": I,
        "spine": B,
    },
    "attention_backend": S,
    "cuda_graph": B,
    "cuda_graph_max_bs": I,
    "mem_fraction_static": F0,
    "context_length": I0,
    "max_running_requests": I0,
    "trust_remote_code": B,
    "tool_call_parser": S0,
    "reasoning_parser": S0,
    "skip_server_warmup": B,
    "enable_metrics": B,
    "extra_args": LIST,
    "service": {
        "gpu_free_timeout_sec": I,
        "gpu_free_max_used_mib": I,
        "ready_timeout_sec": I,
        "timeout_stop_sec": I,
        "restart_sec": I,
        "start_limit_burst": I,
        "start_limit_interval_sec": I,
        "limit_nofile": I,
        "fabric_manager": B,
    },
    "router": {
        "host": S,
        "port": I,
        "policy": S,
        "worker_urls": LIST,
    },
}


@dataclass
class Profile:
    """A resolved, validated profile: its name, the files it came from, and its values."""

    name: str
    data: dict
    sources: list[str] = field(default_factory=list)

    def __getitem__(self, key: str):
        return self.data[key]

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "sources": self.sources, "data": self.data}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str, origin: str) -> "Profile":
        try:
            raw = json.loads(text)
            profile = cls(name=raw["name"], data=raw["data"], sources=list(raw.get("sources", [])))
        except (ValueError, KeyError, TypeError) as err:
            raise UserError(f"{origin}: the embedded profile is unreadable ({err}); re-install the unit") from None
        _check_tree(profile.data, SCHEMA, origin, "")
        _check_complete(profile.data, SCHEMA, origin, "")
        check_values(profile, origin)
        return profile

    def summary(self) -> str:
        spec = self.data["speculative"]
        if spec["algorithm"] == "DDTREE":
            spine = "on" if spec["spine"] else "off"
            tree = f"budget {spec['budget']}, topk {spec['topk']}, block {spec['block_size']}, spine {spine}"
        else:
            tree = f"linear DFlash, block {spec['block_size']}"
        return f"{self.name} ({tree})"


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
        apply_set(data, assignment)
    return _finish(path.stem, data, sources)


def with_sets(profile: Profile, sets: list[str]) -> Profile:
    """A copy of `profile` with `--set` overrides applied and everything validated again."""
    data = copy.deepcopy(profile.data)
    for assignment in sets:
        apply_set(data, assignment)
    return _finish(profile.name, data, list(profile.sources))


def _finish(name: str, data: dict, sources: list[str]) -> Profile:
    _check_tree(data, SCHEMA, f"profile {name}", "")
    _check_complete(data, SCHEMA, f"profile {name}", "")
    if data["python"] is None:
        # The venv that runs k26-deploy is the one that has SGLang and this toolkit.
        data["python"] = sys.executable
    profile = Profile(name=name, data=data, sources=sources)
    check_values(profile, f"profile {name}")
    return profile


def apply_set(data: dict, assignment: str) -> None:
    """Apply one `--set dotted.key=value`, the value parsed per the schema."""
    key, sep, text = assignment.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UserError(f"--set {assignment!r}: expected KEY=VALUE, e.g. --set speculative.budget=16")
    parts = key.split(".")
    node, schema = data, SCHEMA
    for i, part in enumerate(parts):
        spec = schema.get(part) if isinstance(schema, dict) else None
        last = i == len(parts) - 1
        if isinstance(spec, Kind) and spec.name == "map" and i == len(parts) - 2:
            node.setdefault(part, {})[parts[-1]] = text
            return
        if spec is None or (last and isinstance(spec, dict)) or (not last and isinstance(spec, Kind)):
            known = _dotted_keys(SCHEMA)
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(known)}"
            raise UserError(f"--set {key}: unknown key ({hint})")
        if last:
            node[part] = _parse_text(text, spec, f"--set {key}")
            return
        node = node.setdefault(part, {})
        schema = spec


def check_values(profile: Profile, origin: str) -> None:
    """Ranges and relations between keys that types alone cannot express."""
    d = profile.data
    spec, par, svc = d["speculative"], d["parallel"], d["service"]

    def bad(key: str, why: str) -> UserError:
        return UserError(f"{origin}: {key} {why}")

    if not 1 <= d["port"] <= 65535:
        raise bad("port", f"must be 1..65535, got {d['port']}")
    if not 1 <= d["router"]["port"] <= 65535:
        raise bad("router.port", f"must be 1..65535, got {d['router']['port']}")
    if spec["algorithm"] not in ALGORITHMS:
        raise bad("speculative.algorithm", f"must be one of {', '.join(ALGORITHMS)}, got {spec['algorithm']!r}")
    if spec["block_size"] < 2:
        raise bad("speculative.block_size", f"must be >= 2, got {spec['block_size']}")
    if spec["draft_window_size"] < spec["block_size"]:
        raise bad("speculative.draft_window_size", "must be >= speculative.block_size")
    if spec["topk"] < 1:
        raise bad("speculative.topk", f"must be >= 1, got {spec['topk']}")
    if spec["budget"] < 1:
        raise bad("speculative.budget", f"must be >= 1, got {spec['budget']}")
    limit = budget.max_budget(spec["block_size"] - 1, spec["topk"])
    if spec["budget"] > limit:
        raise bad(
            "speculative.budget",
            f"{spec['budget']} is larger than a tree of topk {spec['topk']} and block {spec['block_size']} "
            f"can hold (at most {limit} = sum of topk^d for d = 1..block-1)",
        )
    if not budget.codes_fit(spec["block_size"] - 1, spec["topk"], spec["budget"]):
        raise bad(
            "speculative.topk",
            f"{spec['topk']} is too wide for a tree of {min(spec['block_size'] - 1, spec['budget'])} levels "
            "(the tree builder needs max(topk, 2)^min(block-1, budget) <= 2^30); lower topk or the budget",
        )
    for key in ("tp_size", "nnodes"):
        if par[key] < 1:
            raise bad(f"parallel.{key}", f"must be >= 1, got {par[key]}")
    if par["ep_size"] is not None and (par["ep_size"] < 1 or par["tp_size"] % par["ep_size"]):
        raise bad("parallel.ep_size", f"must divide parallel.tp_size ({par['tp_size']}), got {par['ep_size']}")
    if not 0 <= par["node_rank"] < par["nnodes"]:
        raise bad("parallel.node_rank", f"must be in 0..nnodes-1 ({par['nnodes'] - 1}), got {par['node_rank']}")
    if par["nnodes"] > 1 and not par["dist_init_addr"]:
        raise bad("parallel.dist_init_addr", "is required when parallel.nnodes > 1 (HOST:PORT of node 0)")
    if d["cuda_graph_max_bs"] < 1:
        raise bad("cuda_graph_max_bs", f"must be >= 1, got {d['cuda_graph_max_bs']}")
    if d["mem_fraction_static"] is not None and not 0 < d["mem_fraction_static"] < 1:
        raise bad("mem_fraction_static", f"must be between 0 and 1, got {d['mem_fraction_static']}")
    for key, value in svc.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise bad(f"service.{key}", f"must be >= 1, got {value}")
    if d["extra_args"] and not d["extra_args"][0].startswith("--"):
        raise bad("extra_args", f"must start with a --flag, got {d['extra_args'][0]!r}")
    for arg in d["extra_args"]:
        if arg.startswith("--speculative-ddtree") or arg in ("--port", "--host", "--model-path"):
            raise bad("extra_args", f"must not carry {arg}: set it through its profile key")


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
    raw = _read_yaml(path)
    parent_ref = raw.pop("extends", None)
    origin = f"profile {path}"
    _check_tree(raw, SCHEMA, origin, "")
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


def _read_yaml(path: Path) -> dict:
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "invalid YAML"
        raise UserError(f"profile {path}{where}: {problem}") from None
    except OSError as err:
        raise UserError(f"profile {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"profile {path}: not a YAML text file (not UTF-8)") from None
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise UserError(f"profile {path}: must be a mapping of keys to values, got {type(raw).__name__}")
    return raw


def _merge(base: dict, over: dict) -> dict:
    """Nested mappings merge key by key; every other value (lists too) replaces."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _check_tree(data: dict, schema: dict, origin: str, prefix: str) -> None:
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        spec = schema.get(key) if isinstance(key, str) else None
        if spec is None:
            close = difflib.get_close_matches(str(key), list(schema), n=1)
            hint = f"did you mean '{prefix}{close[0]}'?" if close else f"known here: {', '.join(sorted(schema))}"
            raise UserError(f"{origin}: unknown key {dotted!r} ({hint})")
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise UserError(f"{origin}: {dotted} must be a mapping of keys, got {_show(value)}")
            _check_tree(value, spec, origin, f"{dotted}.")
        else:
            _check_value(value, spec, origin, dotted)


def _check_complete(data: dict, schema: dict, origin: str, prefix: str) -> None:
    for key, spec in schema.items():
        dotted = f"{prefix}{key}"
        if key not in data:
            raise UserError(f"{origin}: missing key {dotted!r} (a profile usually starts with 'extends: base')")
        if isinstance(spec, dict):
            _check_complete(data[key], spec, origin, f"{dotted}.")


def _check_value(value, kind: Kind, origin: str, key: str) -> None:
    def wrong(expected: str) -> UserError:
        return UserError(f"{origin}: {key} must be {expected}, got {_show(value)}")

    if value is None:
        if kind.nullable:
            return
        raise wrong(f"a {kind.name} (not null)")
    if kind.name in ("str", "path"):
        if not isinstance(value, str):
            raise wrong("a string")
        _check_text(value, origin, key)
        if kind.name == "path" and not value.startswith("/"):
            raise wrong("an absolute path")
    elif kind.name == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise wrong("an integer")
    elif kind.name == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise wrong("a number")
    elif kind.name == "bool":
        if not isinstance(value, bool):
            raise wrong("true or false")
    elif kind.name == "list":
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise wrong("a list of strings")
        for item in value:
            _check_text(item, origin, key)
    elif kind.name == "map":
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise wrong("a mapping of NAME: \"string value\"")
        for name, item in value.items():
            if not name.replace("_", "a").isalnum() or name[0].isdigit():
                raise UserError(f"{origin}: {key}: {name!r} is not a valid environment variable name")
            _check_text(item, origin, f"{key}.{name}")


def _check_text(value: str, origin: str, key: str) -> None:
    # Profile strings end up inside a unit file: a newline would start a new directive.
    if any(ord(ch) < 32 for ch in value):
        raise UserError(f"{origin}: {key} must not contain control characters (newline, tab)")


def _parse_text(text: str, kind: Kind, origin: str):
    lowered = text.strip().lower()
    if kind.nullable and lowered in ("null", "none", "~", ""):
        return None
    if kind.name == "int":
        try:
            return int(text)
        except ValueError:
            raise UserError(f"{origin}: must be an integer, got {text!r}") from None
    if kind.name == "float":
        try:
            return float(text)
        except ValueError:
            raise UserError(f"{origin}: must be a number, got {text!r}") from None
    if kind.name == "bool":
        if lowered in ("true", "yes", "on", "1"):
            return True
        if lowered in ("false", "no", "off", "0"):
            return False
        raise UserError(f"{origin}: must be true or false, got {text!r}")
    if kind.name == "list":
        return [item.strip() for item in text.split(",") if item.strip()]
    if kind.name == "map":
        raise UserError(f"{origin}: set one entry at a time, e.g. --set environment.NAME=value")
    return text


def _dotted_keys(schema: dict, prefix: str = "") -> list[str]:
    keys = []
    for key, spec in schema.items():
        if isinstance(spec, dict):
            keys.extend(_dotted_keys(spec, f"{prefix}{key}."))
        else:
            keys.append(f"{prefix}{key}")
    return keys


def _show(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

"""The pinned SGLang 0.5.11 argument parser, read from its real source without importing sglang;
the pinned sglang-router, unpacked to run from.

The wheels are downloaded at most once per test run into $K26_WHEEL_CACHE
(tests/run.sh sets it; the one network access the suite allows), and files are
read straight out of them with zipfile. Flags, switches and literal choices come
from the AST of `add_argument(...)` calls.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.patchset.pins import default_root, load
from k26_ddtree.patchset.wheel import wheel_for

REPO = Path(__file__).resolve().parents[2]
SERVER_ARGS = "sglang/srt/server_args.py"
# The patched server_args.py registers the DDTree flags by calling add_cli_args() here.
DDTREE_ARGS_MODULE = REPO / "k26_ddtree" / "sglang" / "v0_5_11" / "args.py"
# What our patch adds, for as long as the patch set does not patch server_args.py.
DDTREE_FLAGS = {
    "--speculative-ddtree-budget": "value",
    "--speculative-ddtree-topk": "value",
    "--speculative-ddtree-spine": "switch",
    "--speculative-ddtree-trace": "value",
    "--speculative-ddtree-trace-max-mb": "value",
}


@dataclass(frozen=True)
class Arg:
    switch: bool  # store_true / store_false: takes no value
    choices: frozenset[str] | None  # None: no choices, or not a literal the AST can read


def pinned_wheel(requirement: str = "sglang==0.5.11") -> Path:
    """The wheel of `requirement` (NAME==VERSION), downloaded once into the cache."""
    name, version = requirement.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    cache = Path(os.environ.get("K26_WHEEL_CACHE") or REPO / ".cache" / "wheels")
    cache.mkdir(parents=True, exist_ok=True)
    found = sorted(cache.glob(pattern))
    if not found:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", requirement, "-d", str(cache)],
            check=True, timeout=600,
        )
        found = sorted(cache.glob(pattern))
    if not found:
        raise FileNotFoundError(f"pip download left no {pattern} in {cache}")
    return found[0]


def unpacked_wheel(requirement: str) -> Path:
    """A folder holding the wheel's files, for PYTHONPATH (a pure or abi3 wheel runs from there unchanged)."""
    wheel = pinned_wheel(requirement)
    folder = wheel.with_suffix("")
    if not folder.is_dir():
        staging = folder.with_name(folder.name + ".partial")
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(staging)
        staging.rename(folder)
    return folder


def patched_server_args() -> str | None:
    """server_args.py of the default patch set's pinned wheel with its diff applied; None when the
    patch set leaves it alone."""
    patch_set = load(default_root())
    pin = next((pin for pin in patch_set.files if pin.rel == SERVER_ARGS), None)
    if pin is None:
        return None
    with zipfile.ZipFile(wheel_for(patch_set.root)) as zf:
        return patch_set.patched_bytes(pin, zf.read(SERVER_ARGS)).decode("utf-8")


def wheel_source(member: str) -> str:
    with zipfile.ZipFile(pinned_wheel()) as zf:
        return zf.read(member).decode("utf-8")


def parser_args(source: str) -> dict[str, Arg]:
    """Every option string of every add_argument call, with its switch-ness and literal choices."""
    tree = ast.parse(source)
    constants = _module_literals(tree)
    args: dict[str, Arg] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        keywords = {k.arg: k.value for k in node.keywords}
        action = keywords.get("action")
        switch = isinstance(action, ast.Constant) and action.value in ("store_true", "store_false")
        choices = _literal(keywords.get("choices"), constants)
        for name in names:
            args[name] = Arg(switch, frozenset(map(str, choices)) if choices is not None else None)
    return args


def dict_keys(source: str, name: str) -> set[str]:
    """Keys of a dict literal assigned to `name` (e.g. a class attribute mapping parser names)."""
    for node in ast.walk(ast.parse(source)):
        target = node.target if isinstance(node, ast.AnnAssign) else (
            node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
        if isinstance(target, ast.Name) and target.id == name and isinstance(node.value, ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
    raise LookupError(f"no dict literal named {name}")


def _module_literals(tree: ast.Module) -> dict[str, object]:
    found = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def _literal(node, constants: dict) -> list | None:
    if node is None:
        return None
    if isinstance(node, ast.Name):
        value = constants.get(node.id)
        return list(value) if isinstance(value, (list, set, tuple)) else None
    try:
        value = ast.literal_eval(node)
    except ValueError:
        return None
    return list(value) if isinstance(value, (list, set, tuple)) else None

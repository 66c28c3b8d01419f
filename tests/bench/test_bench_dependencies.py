"""`pip install .` alone brings everything `k26-deploy bench` imports (no extra to guess)."""

from __future__ import annotations

import ast
import re
import sys
from importlib import metadata
from pathlib import Path

import k26_ddtree

PACKAGE = Path(k26_ddtree.__file__).parent
MODULES = [*sorted((PACKAGE / "bench").glob("*.py")), PACKAGE / "progress.py"]


def _optional(node: ast.Try) -> bool:
    """A try that catches ImportError (or anything): what it imports may be missing."""
    for handler in node.handlers:
        names = [handler.type] if not isinstance(handler.type, ast.Tuple) else handler.type.elts
        if handler.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "Exception")
                                       for n in names):
            return True
    return False


def _required_imports(tree: ast.AST, optional: bool = False) -> set[str]:
    found = set()
    for node in ast.iter_child_nodes(tree):
        inside_optional = optional or (isinstance(node, ast.Try) and _optional(node))
        if isinstance(node, ast.Import) and not optional:
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and not optional:
            found.add(node.module.split(".")[0])
        found |= _required_imports(node, inside_optional)
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def test_every_third_party_import_of_the_bench_is_a_default_dependency():
    imported = set()
    for module in MODULES:
        imported |= _required_imports(ast.parse(module.read_text(encoding="utf-8")))
    third_party = {name for name in imported if name not in sys.stdlib_module_names and name != "k26_ddtree"}
    assert {"httpx", "matplotlib", "tqdm", "yaml"} <= third_party
    distributions = metadata.packages_distributions()
    default = {_normal(re.match(r"[A-Za-z0-9._-]+", req).group()) for req in metadata.requires("k26-ddtree")
               if "extra ==" not in req}
    missing = {name for name in third_party if not {_normal(d) for d in distributions.get(name, [name])} & default}
    assert not missing, f"imported by k26_ddtree/bench but only in an extra or nowhere: {sorted(missing)}"

"""Make this k26_ddtree importable by the Python that runs the patched SGLang.

The patched files import `k26_ddtree.sglang...`, so the service's Python must
find this package. What is done depends on where sglang lives:

- sglang's Python already imports this k26_ddtree (same venv, pip install, or an
  identical copy): nothing.
- sglang is in a real site dir (an interpreter beside it lists it on sys.path,
  so it processes .pth files) and this k26_ddtree runs from a source checkout:
  write <site>/k26_ddtree_sglang.pth naming the checkout, as `pip install -e` does.
- otherwise (a PYTHONPATH dir or trimmed bundle, where .pth files are not
  processed, or this k26_ddtree is installed in another environment): copy the
  package to <site>/k26_ddtree, marked as our copy so a later apply refreshes it
  and revert removes it.

A different k26_ddtree already importable there is refused: the patched files
must run against the hooks they were written for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import k26_ddtree
from k26_ddtree.errors import UserError
from k26_ddtree.hashing import tree_digest
from k26_ddtree.patchset.transaction import CopyStep, FileStep, Step
from k26_ddtree.resources import source_root

PTH_NAME = "k26_ddtree_sglang.pth"
COPY_MARKER = ".copied-by-k26-deploy-apply"
_PROBE_TIMEOUT_S = 60
_PROBE = (
    "import importlib.util, json, sys\n"
    "spec = importlib.util.find_spec('k26_ddtree')\n"
    "print(json.dumps({'path': sys.path, 'origin': spec.origin if spec else None}))\n"
)

NOTHING = "nothing"
PTH = "pth"
COPY = "copy"


@dataclass(frozen=True)
class ImportPlan:
    action: str   # NOTHING, PTH or COPY
    reason: str   # one line for the progress output
    site: Path


def our_package() -> Path:
    return Path(k26_ddtree.__file__).resolve().parent


def _candidate_interpreters(site: Path) -> list[Path]:
    found = [Path(sys.executable)]
    # <prefix>/lib/pythonX.Y/site-packages (venv, /usr/local) or /usr/lib/python3/dist-packages
    version = re.fullmatch(r"python(\d+(?:\.\d+)?)", site.parent.name)
    if version and site.parent.parent.name in ("lib", "lib64"):
        prefix = site.parent.parent.parent
        names = [f"python{version.group(1)}", "python3", "python"]
        found += [prefix / "bin" / name for name in names]
        found += [Path("/usr/bin") / name for name in names]
    unique = []
    for path in found:
        if path.is_file() and os.access(path, os.X_OK) and path not in unique:
            unique.append(path)
    return unique


def _probe(python: Path) -> dict | None:
    # -I: the view of a service that sets no PYTHONPATH; site-packages and .pth files still count.
    try:
        done = subprocess.run([str(python), "-I", "-c", _PROBE], capture_output=True, text=True,
                              timeout=_PROBE_TIMEOUT_S, check=True)
        return json.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def site_interpreter(site: Path) -> tuple[Path, dict] | None:
    """An interpreter whose default sys.path holds `site`, with what it sees, or None (not a real site dir)."""
    wanted = os.path.realpath(site)
    for python in _candidate_interpreters(site):
        seen = _probe(python)
        if seen and any(entry and os.path.realpath(entry) == wanted for entry in seen["path"]):
            return python, seen
    return None


def _is_our_copy(package: Path) -> bool:
    return (package / COPY_MARKER).is_file()


def _same_code(package: Path, ours: Path) -> bool:
    return package.resolve() == ours or tree_digest(package, "*.py") == tree_digest(ours, "*.py")


def plan(site: Path) -> ImportPlan:
    ours = our_package()
    local = site / "k26_ddtree"
    if (local / "__init__.py").is_file():
        if _same_code(local, ours):
            return ImportPlan(NOTHING, f"{local} is this k26_ddtree", site)
        if _is_our_copy(local):
            return ImportPlan(COPY, f"refreshing the copy at {local} (it differs from {ours})", site)
        raise UserError(f"{local} is a different k26_ddtree than this one ({ours}); remove it or run its own k26-deploy")
    found = site_interpreter(site)
    if found is not None:
        python, seen = found
        origin = seen["origin"]
        if origin and Path(origin).name == "__init__.py":
            theirs = Path(origin).resolve().parent
            if _same_code(theirs, ours):
                return ImportPlan(NOTHING, f"{python} already imports this k26_ddtree ({theirs})", site)
            if not (site / PTH_NAME).is_file():
                raise UserError(f"{python} imports a different k26_ddtree ({theirs}) than this one ({ours}); "
                                "uninstall it there or run its own k26-deploy")
        if source_root() is not None:
            return ImportPlan(PTH, f"{site / PTH_NAME} -> {ours.parent} (for {python})", site)
        return _copy_plan(site, ours, f"for {python}")
    return _copy_plan(site, ours, f"{site} is not a site dir of any Python found, so .pth files there are not read")


def _copy_plan(site: Path, ours: Path, why: str) -> ImportPlan:
    local = site / "k26_ddtree"
    if local.exists() and not _is_our_copy(local):
        # e.g. the _data dir an editable install leaves there: never copy over what is not ours
        raise UserError(f"{local} exists and is not a k26_ddtree package; cannot copy this one there ({why})")
    return ImportPlan(COPY, f"copying {ours} to {local} ({why})", site)


def steps(import_plan: ImportPlan) -> list[Step]:
    """What apply's transaction does to carry out the plan."""
    site = import_plan.site
    if import_plan.action == PTH:
        pth = site / PTH_NAME
        text = f"# written by k26-deploy apply: the patched sglang imports k26_ddtree from here\n{our_package().parent}\n"
        old = pth.read_bytes() if pth.is_file() else None
        return [] if old == text.encode() else [FileStep(pth, "import", old, text.encode())]
    if import_plan.action == COPY:
        return [CopyStep(site / "k26_ddtree", _build_copy)]
    return []


def _build_copy(dest: Path) -> None:
    shutil.copytree(our_package(), dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (dest / COPY_MARKER).write_text(f"copied from {our_package()}\n")


def removal_steps(site: Path) -> list[Step]:
    """What revert's transaction does to take away what apply added (our .pth, our marked copy)."""
    found: list[Step] = []
    pth = site / PTH_NAME
    if pth.is_file():
        found.append(FileStep(pth, "import", pth.read_bytes(), None))
    if _is_our_copy(site / "k26_ddtree"):
        found.append(CopyStep(site / "k26_ddtree", None))
    return found


def undo(site: Path) -> list[str]:
    """Remove our .pth and our marked copy at once, outside any transaction (for test fixtures that
    import the checkout's k26_ddtree instead); lines saying what was removed."""
    removed = []
    pth = site / PTH_NAME
    if pth.is_file():
        pth.unlink()
        removed.append(f"removed {pth}")
    copy = site / "k26_ddtree"
    if _is_our_copy(copy):
        shutil.rmtree(copy)
        removed.append(f"removed the copy {copy}")
    return removed

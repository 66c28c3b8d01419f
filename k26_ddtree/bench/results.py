"""The results file: {"schema": ..., "runs": [run, ...]} (bench/results/README.md).

A run is written after every finished cell (atomically: temp file, then
os.replace), so Ctrl-C or a crash leaves every finished cell on disk and never
a half-written file. Runs append to an existing file: one file can hold AR,
DFLASH and DDTREE runs for a side-by-side report.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.errors import UserError
from k26_ddtree.resources import source_root

SCHEMA = "k26-ddtree-bench/1"
RUN_KEYS = ("run_id", "label", "status", "started_at", "cells")
CELL_KEYS = ("context", "concurrency", "has_errors", "output_tok_s", "request_tok_s", "accept_length",
             "server_avg_spec_accept_length")
_SECRET_KEY = re.compile(r"(api[-_]?key|password|secret|(^|[-_])token$)", re.IGNORECASE)


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def git_sha() -> str:
    """HEAD of this repository's checkout, or "unknown" (installed wheel, no git)."""
    root = source_root()
    if root is None:
        return "unknown"
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"


def _scrub_argv(items: list) -> list:
    """Command lines: redact the value after (or in) a secret-looking flag."""
    out, hide_next = [], False
    for item in items:
        if hide_next:
            out.append("<redacted>")
            hide_next = False
            continue
        flag, equals, _ = item.partition("=") if isinstance(item, str) else ("", "", "")
        if flag.startswith("-") and _SECRET_KEY.search(flag):
            out.append(f"{flag}=<redacted>" if equals else item)
            hide_next = not equals
            continue
        out.append(scrub_secrets(item))
    return out


def scrub_secrets(value):
    """Copy of server_info with every key-like field redacted: result files get shared."""
    if isinstance(value, dict):
        return {
            k: ("<redacted>" if _SECRET_KEY.search(str(k)) and v not in (None, "") else scrub_secrets(v))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return _scrub_argv(value)
    return value


def algorithm_of(server_info: dict) -> str:
    """AR, DFLASH or DDTREE. The patched server runs DDTree as a DFLASH mode (it reports
    speculative_algorithm DFLASH), so a DDTree budget in its args is what tells them apart."""
    algorithm = str(server_info.get("speculative_algorithm") or "").upper()
    if not algorithm or algorithm == "NONE":
        return "AR"
    if server_info.get("speculative_ddtree_budget") is not None:
        return "DDTREE"
    return algorithm


def run_label(server_info: dict, budget, topk) -> str:
    """Default label: AR, DFLASH or DDTREE b<budget> k<topk>, from the server's own args."""
    algorithm = algorithm_of(server_info)
    if algorithm == "AR":
        return "AR"
    if budget is not None:
        return f"{algorithm} b{budget}" + (f" k{topk}" if topk is not None else "")
    return algorithm


def load_results(path: Path) -> dict:
    """Parse a results file; a clear error for anything that is not one."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read {path}: {err.strerror}") from None
    except json.JSONDecodeError as err:
        raise UserError(f"{path} is not JSON ({err.msg} at line {err.lineno})") from None
    except UnicodeDecodeError:
        raise UserError(f"{path} is not JSON (not UTF-8 text)") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA or not isinstance(document.get("runs"), list):
        raise UserError(f"{path} is not a k26-deploy bench results file (schema {SCHEMA})")
    for number, run in enumerate(document["runs"], 1):
        problem = _run_problem(run)
        if problem:
            raise UserError(f"{path}: run {number} {problem}: not written by k26-deploy bench (schema {SCHEMA})")
    return document


def _run_problem(run) -> str | None:
    """What keeps `run` from being read as a run (the keys every reader relies on), or None."""
    if not isinstance(run, dict):
        return "is not an object"
    missing = [key for key in RUN_KEYS if key not in run]
    if missing:
        return f"lacks {', '.join(missing)}"
    if not isinstance(run["cells"], list) or not all(isinstance(c, dict) for c in run["cells"]):
        return "has cells that are not a list of objects"
    for cell in run["cells"]:
        missing = [key for key in CELL_KEYS if key not in cell]
        if missing:
            return f"has a cell that lacks {', '.join(missing)}"
    return None


def write_json_atomic(path: Path, document: dict) -> None:
    atomic.write_text(path, json.dumps(document, indent=1) + "\n")


class RunWriter:
    """Holds one run and rewrites it into the results file on every save()."""

    def __init__(self, path: Path, run: dict):
        self.path = path
        self.run = run
        if path.exists():
            load_results(path)

    def save(self) -> None:
        document = load_results(self.path) if self.path.exists() else {"schema": SCHEMA, "runs": []}
        runs = [r for r in document["runs"] if r.get("run_id") != self.run["run_id"]]
        runs.append(self.run)
        document["runs"] = runs
        write_json_atomic(self.path, document)

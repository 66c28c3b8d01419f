"""The results file: {"schema": ..., "runs": [run, ...]} (bench/results/README.md).

A run is written after every finished cell (atomically: temp file, then
os.replace), so Ctrl-C or a crash leaves every finished cell on disk and never
a half-written file. Runs append to an existing file: one file can hold AR,
DFLASH and DDTREE runs for a side-by-side report.
"""

from __future__ import annotations

import json
import math
import re
import secrets
import subprocess
from datetime import datetime, timezone
from pathlib import Path

from k26_ddtree import atomic, jsonread, paths
from k26_ddtree.errors import UserError
from k26_ddtree.resources import source_root

SCHEMA = "k26-ddtree-bench/1"
# A cell builds max(8, 2*C) prompts (or --requests) before its first request, so a mistyped C
# or request count would fill memory before anything is measured; --concurrency and --requests
# are refused past these, and a results file holding more was not written by the bench.
MAX_CONCURRENCY = 4096
MAX_REQUESTS = 2 * MAX_CONCURRENCY
# Above any rate (tok/s), latency (ms) or acceptance a bench measures; far below the float
# range, near whose end matplotlib cannot lay out an axis.
MAX_MEASURE = 1e9
# SGLang's answers nest under 10 levels (client.MAX_ANSWER_DEPTH); one recorded in a run
# (server_info) sits 3 levels down in the file (runs, run, server_info), so a file may be a
# little deeper than an answer. Both stay far below where the scrubber and the writer recurse
# past Python's limit (near 500).
MAX_FILE_DEPTH = 100
RUN_KEYS = ("run_id", "label", "status", "started_at", "cells")
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
    if (server_info.get("speculative_ddtree_budget") is not None
            or server_info.get("speculative_ddtree_budget_schedule") is not None):
        return "DDTREE"
    return algorithm


def run_label(server_info: dict, budget, topk) -> str:
    """Default label: AR, DFLASH, DDTREE b<budget> k<topk> or DDTREE schedule <schedule>, from the
    server's own args."""
    algorithm = algorithm_of(server_info)
    if algorithm == "AR":
        return "AR"
    if budget is not None:
        return f"{algorithm} b{budget}" + (f" k{topk}" if topk is not None else "")
    schedule = server_info.get("speculative_ddtree_budget_schedule")
    return algorithm if schedule is None else f"{algorithm} schedule {schedule}"


def load_results(path: Path) -> dict:
    """Parse a results file; a clear error for anything that is not one, down to each number the
    readers (report, plots, tune) use, so none of them meets a value it cannot handle."""
    try:
        document = jsonread.read_json(path, max_depth=MAX_FILE_DEPTH)
    except FileNotFoundError:
        raise UserError(f"cannot read {path}: no such file") from None
    except jsonread.NotText:
        raise UserError(f"{path} is not JSON (not UTF-8 text)") from None
    except jsonread.TooDeep as err:
        raise UserError(f"{path} is not a k26-deploy bench results file ({err})") from None
    except jsonread.Unreadable as err:
        raise UserError(f"{err}: not a k26-deploy bench results file") from None
    if not isinstance(document, dict) or document.get("schema") != SCHEMA or not isinstance(document.get("runs"), list):
        raise UserError(f"{path} is not a k26-deploy bench results file (schema {SCHEMA})")
    for number, run in enumerate(document["runs"], 1):
        problem = _run_problem(run)
        if problem:
            raise UserError(f"{path}: run {number} {problem}: not written by k26-deploy bench (schema {SCHEMA})")
    return document


def _shown(value) -> str:
    return json.dumps(value)[:40]


_MEASURE = f"null or a number in 0..{MAX_MEASURE:g}"


# Checks of one field: None when the value fits, else what the field must hold.
def _whole(low: int, high: int | None = None):
    expected = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"

    def check(value) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return expected
        return None if low <= value and (high is None or value <= high) else expected
    return check


def _measure(value) -> str | None:
    fits = value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)
                             and math.isfinite(value) and 0 <= value <= MAX_MEASURE)
    return None if fits else _MEASURE


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _measures(*keys: str):
    def check(value) -> str | None:
        fits = isinstance(value, dict) and all(key in value and _measure(value[key]) is None for key in keys)
        return None if fits else f"an object whose {', '.join(keys)} are each {_MEASURE}"
    return check


def _problem(where: str, value, check) -> str | None:
    expected = check(value)
    return f"{where} is {_shown(value)}, not {expected}" if expected else None


_STATS = ("mean", "p50", "p99")
# Every field of a cell that a reader uses, and its check.
CELL_FIELDS = {
    "context": _whole(1),
    "concurrency": _whole(1, MAX_CONCURRENCY),
    "requests": _whole(0, MAX_REQUESTS),
    "ok": _whole(0, MAX_REQUESTS),
    "errors": _whole(0, MAX_REQUESTS),
    "has_errors": _flag,
    "interrupted": _flag,
    "output_tok_s": _measure,
    "request_tok_s": _measures("mean", "p50"),
    "ttft_ms": _measures(*_STATS),
    "itl_ms": _measures(*_STATS),
    "tpot_ms": _measures(*_STATS),
    "accept_length": _measure,
    "server_avg_spec_accept_length": _measure,
}


def _string(value) -> str | None:
    return None if isinstance(value, str) else "a string"


def _optional_string(value) -> str | None:
    return None if value is None or isinstance(value, str) else "a string or null"


def _fields_problem(record: dict, fields: dict, what: str, label: str) -> str | None:
    """The first field of `fields` that `record` lacks or holds wrongly, or None."""
    missing = [key for key in fields if key not in record]
    if missing:
        return f"has {what} that lacks {', '.join(missing)}"
    for key, check in fields.items():
        if problem := _problem(f"{label} {key}", record[key], check):
            return problem
    return None


def _run_problem(run) -> str | None:
    """What keeps `run` from being read as a run (the fields every reader relies on), or None."""
    if not isinstance(run, dict):
        return "is not an object"
    missing = [key for key in RUN_KEYS if key not in run]
    if missing:
        return f"lacks {', '.join(missing)}"
    for key in ("run_id", "label", "status", "started_at"):
        if problem := _problem(key, run[key], _string):
            return problem
    if problem := _problem("git_sha", run.get("git_sha"), _optional_string):
        return problem
    for key in ("budget", "topk"):
        if run.get(key) is not None and (problem := _problem(key, run[key], _whole(1))):
            return problem
    if not isinstance(run["cells"], list) or not all(isinstance(c, dict) for c in run["cells"]):
        return "has cells that are not a list of objects"
    for number, cell in enumerate(run["cells"], 1):
        if problem := _fields_problem(cell, CELL_FIELDS, "a cell", f"cell {number}"):
            return problem
    return _eval_problem(run.get("coding_eval"))


def _task_results(value) -> str | None:
    fits = isinstance(value, list) and all(
        isinstance(t, dict) and isinstance(t.get("task"), str) and isinstance(t.get("passed"), bool)
        and isinstance(t.get("reason"), str) for t in value)
    return None if fits else "a list of {task, passed, reason}"


# Every field of a coding_eval endpoint that the report uses, and its check.
ENDPOINT_FIELDS = {"passed": _whole(0), "total": _whole(0), "output_tok_s": _measure,
                   "accept_length": _measure, "results": _task_results}


def _eval_problem(evaluation) -> str | None:
    """What keeps a run's coding_eval from being reported, or None."""
    if evaluation is None:
        return None
    if not isinstance(evaluation, dict) or not isinstance(evaluation.get("endpoints"), dict):
        return "has a coding_eval that is not an object with an endpoints object"
    if problem := _problem("coding_eval.sandbox", evaluation.get("sandbox"), _optional_string):
        return problem
    for endpoint, result in evaluation["endpoints"].items():
        if not isinstance(result, dict):
            return f"coding_eval endpoint {endpoint} is not an object"
        if problem := _fields_problem(result, ENDPOINT_FIELDS, f"a coding_eval endpoint {endpoint}",
                                      f"coding_eval endpoint {endpoint}"):
            return problem
    return None


def write_json_atomic(path: Path, document: dict) -> None:
    atomic.write_text(path, json.dumps(document, indent=1) + "\n")


class RunWriter:
    """Holds one run and rewrites it into the results file on every save()."""

    def __init__(self, path: Path, run: dict):
        # Read through a link (appending reads the target's runs), so written there too.
        self.path = paths.output_target(path, "--out")
        self.run = run
        if path.exists():
            load_results(path)  # read through the name given, so a refusal names it

    def save(self) -> None:
        document = load_results(self.path) if self.path.exists() else {"schema": SCHEMA, "runs": []}
        runs = [r for r in document["runs"] if r.get("run_id") != self.run["run_id"]]
        runs.append(self.run)
        document["runs"] = runs
        write_json_atomic(self.path, document)

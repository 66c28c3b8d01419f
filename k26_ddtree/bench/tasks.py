"""The coding-eval task set (bench/coding_tasks.yaml, or a file given with --tasks)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from k26_ddtree.errors import UserError
from k26_ddtree.resources import data_path

REQUIRED = ("id", "entry_point", "prompt", "tests")
INSTRUCTIONS = (
    "Answer with the complete function in one ```python code block. "
    "Use only the Python standard library; do not read input or print."
)


@dataclass(frozen=True)
class CodingTask:
    id: str
    entry_point: str
    prompt: str
    tests: str

    def user_message(self) -> str:
        return f"{self.prompt.strip()}\n\n{INSTRUCTIONS}"


def default_tasks_path() -> Path:
    return data_path("bench", "coding_tasks.yaml")


def load_tasks(path: Path | None = None, only: list[str] | None = None) -> list[CodingTask]:
    """Parse and check the task file; `only` keeps the named task ids."""
    path = path or default_tasks_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise UserError(f"cannot read tasks file {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise UserError(f"tasks file {path} is not valid YAML (not UTF-8 text)") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise UserError(f"tasks file {path}{where} is not valid YAML: {getattr(err, 'problem', None) or err}") from None
    if not isinstance(raw, list) or not raw:
        raise UserError(f"tasks file {path} must be a non-empty list of tasks")
    tasks = []
    for index, item in enumerate(raw):
        missing = [key for key in REQUIRED if not isinstance(item, dict) or not str(item.get(key, "")).strip()]
        if missing:
            raise UserError(f"task #{index + 1} in {path} lacks {', '.join(missing)}")
        tasks.append(CodingTask(*(str(item[key]) for key in REQUIRED)))
    ids = [t.id for t in tasks]
    if len(set(ids)) != len(ids):
        raise UserError(f"tasks file {path} repeats a task id")
    if only:
        unknown = sorted(set(only) - set(ids))
        if unknown:
            raise UserError(f"unknown task id(s): {', '.join(unknown)} (known: {', '.join(ids)})")
        tasks = [t for t in tasks if t.id in only]
    return tasks

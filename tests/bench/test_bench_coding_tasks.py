"""The built-in task set: enough tasks, and every hidden test tells right from wrong."""

from __future__ import annotations

import pytest

from k26_ddtree.bench.sandbox import run_tests
from k26_ddtree.bench.tasks import load_tasks
from k26_ddtree.errors import UserError

from bench_reference_solutions import REFERENCE

TASKS = load_tasks()


def test_at_least_ten_tasks_with_references():
    assert len(TASKS) >= 10
    assert {t.id for t in TASKS} == set(REFERENCE)


@pytest.mark.parametrize("task", TASKS, ids=lambda t: t.id)
def test_reference_passes_and_stub_fails(task, isolation):
    assert task.entry_point in task.prompt
    assert run_tests(REFERENCE[task.id], task.tests).passed, task.id
    stub = f"def {task.entry_point}(*args, **kwargs):\n    return None\n"
    assert not run_tests(stub, task.tests).passed, task.id


def test_task_selection_and_bad_files(tmp_path):
    assert [t.id for t in load_tasks(only=["flatten"])] == ["flatten"]
    with pytest.raises(UserError, match="unknown task"):
        load_tasks(only=["nope"])
    bad = tmp_path / "tasks.yaml"
    bad.write_text("- id: x\n  prompt: p\n")
    with pytest.raises(UserError, match="lacks entry_point, tests"):
        load_tasks(bad)
    with pytest.raises(UserError, match="cannot read"):
        load_tasks(tmp_path / "missing.yaml")

"""`bench sweep`: reconfigure + bench per (budget, topk), then the best config per concurrency."""

from __future__ import annotations

import dataclasses
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.report import winners_markdown
from k26_ddtree import atomic
from k26_ddtree.bench.results import load_results
from k26_ddtree.bench.runner import RunOptions, execute_run
from k26_ddtree.errors import UserError


@dataclass(frozen=True)
class SweepPlan:
    budgets: tuple[int, ...]
    topks: tuple[int, ...]
    reconfigure_cmd: str
    reconfigure_timeout_s: float

    def command(self, budget: int, topk: int) -> list[str]:
        try:
            text = self.reconfigure_cmd.format(python=shlex.quote(sys.executable), budget=budget, topk=topk)
        except (KeyError, IndexError, ValueError) as err:
            raise UserError(f"--reconfigure-cmd: bad template ({err}); use {{python}}, {{budget}}, {{topk}}") from None
        try:
            argv = shlex.split(text)
        except ValueError as err:
            raise UserError(f"--reconfigure-cmd: cannot split {text!r} into words ({err})") from None
        if not argv:
            raise UserError("--reconfigure-cmd is empty: give the command that sets the server to {budget} and "
                            "{topk}, or leave the flag out for k26-deploy reconfigure")
        return argv


def _stderr_fd() -> int | None:
    """Our stderr's descriptor, so reconfigure's progress streams live; None when it has none."""
    try:
        return sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):
        return None


def _reconfigure(plan: SweepPlan, budget: int, topk: int) -> str | None:
    """Run the reconfigure command, its output on our stderr; None on success, else why it failed."""
    argv = plan.command(budget, topk)
    print(f"sweep: budget {budget} topk {topk}: {shlex.join(argv)}", file=sys.stderr, flush=True)
    stderr_fd = _stderr_fd()
    try:
        done = subprocess.run(
            argv,
            timeout=plan.reconfigure_timeout_s,
            stdout=stderr_fd if stderr_fd is not None else subprocess.PIPE,
            stderr=None if stderr_fd is not None else subprocess.STDOUT,
            text=True,
        )
    except FileNotFoundError:
        return f"command not found: {argv[0]}"
    except subprocess.TimeoutExpired:
        return f"reconfigure timed out after {plan.reconfigure_timeout_s:g}s"
    if done.stdout:
        sys.stderr.write(done.stdout)
    return None if done.returncode == 0 else f"reconfigure exited {done.returncode}"


def _recorded_runs(path: Path) -> list[dict]:
    return load_results(path)["runs"] if path.exists() else []


def run_sweep(plan: SweepPlan, base: RunOptions) -> int:
    """Every config in turn; a failed reconfigure is reported and the sweep goes on."""
    recorded_before = {r["run_id"] for r in _recorded_runs(base.out)}
    failed: list[str] = []
    run_ids: list[str] = []
    for budget in plan.budgets:
        for topk in plan.topks:
            problem = _reconfigure(plan, budget, topk)
            if problem:
                failed.append(f"budget {budget} topk {topk}: {problem}")
                print(f"sweep: skipping budget {budget} topk {topk}: {problem}", file=sys.stderr)
                continue
            label = f"{base.label or 'DDTREE'} b{budget} k{topk}"
            options = dataclasses.replace(base, budget=budget, topk=topk, label=label)
            try:
                run = execute_run(options)
            except KeyboardInterrupt:
                print(f"sweep: interrupted; finished runs are in {base.out}", file=sys.stderr)
                return 130
            except UserError as err:
                failed.append(f"budget {budget} topk {topk}: {err}")
                print(f"sweep: budget {budget} topk {topk} failed: {err}", file=sys.stderr)
                continue
            run_ids.append(run["run_id"])
    # Once a run finished the file must be there: gone, it is an error, not a sweep that recorded nothing.
    recorded = load_results(base.out)["runs"] if run_ids else _recorded_runs(base.out)
    runs = [r for r in recorded if r["run_id"] in run_ids]
    summary = winners_markdown(runs) if runs else "No configuration finished.\n"
    if failed:
        summary += "\nFailed configurations:\n\n" + "".join(f"- {line}\n" for line in failed)
    summary_path = base.out.with_suffix(".sweep.md")
    print(summary)
    added = len({r["run_id"] for r in recorded} - recorded_before)
    if added:
        atomic.write_text(summary_path, summary)
        print(f"sweep: {added} run(s) recorded in {base.out}; summary in {summary_path}", file=sys.stderr)
    else:  # a summary file beside no results would read as a sweep that happened
        print(f"sweep: no run recorded, nothing written (neither {base.out} nor {summary_path})", file=sys.stderr)
    return 0 if not failed and all(not c["has_errors"] for r in runs for c in r["cells"]) else 1

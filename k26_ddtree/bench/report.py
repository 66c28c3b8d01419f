"""`bench report`: report.md plus PNG plots from one or more runs, side by side."""

from __future__ import annotations

import contextlib
import shutil
from collections import Counter
from pathlib import Path

from k26_ddtree import atomic
from k26_ddtree.bench.results import utc_now
from k26_ddtree.errors import UserError


def _fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def run_names(runs: list[dict]) -> list[str]:
    """Labels, made unique with the run id where two runs share one."""
    counts = Counter(r["label"] for r in runs)
    return [r["label"] if counts[r["label"]] == 1 else f"{r['label']} ({r['run_id']})" for r in runs]


def _cell_map(run: dict) -> dict[tuple[int, int], dict]:
    return {(c["context"], c["concurrency"]): c for c in run["cells"]}


def _all_keys(runs: list[dict]) -> list[tuple[int, int]]:
    return sorted({key for run in runs for key in _cell_map(run)})


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _flags(cell: dict) -> str:
    flags = []
    if cell["has_errors"]:
        flags.append(f"ERRORS {cell['errors']}")
    if cell.get("interrupted"):
        flags.append("interrupted")
    return ", ".join(flags)


def winners_markdown(runs: list[dict]) -> str:
    """Best config per concurrency (mean output tok/s over the contexts), and per cell."""
    names = run_names(runs)
    maps = [_cell_map(r) for r in runs]
    contexts = sorted({ctx for ctx, _ in _all_keys(runs)})
    concurrencies = sorted({c for _, c in _all_keys(runs)})
    rows = []
    for conc in concurrencies:
        means = []
        for name, cells in zip(names, maps):
            rates = [cells[(ctx, conc)]["output_tok_s"] for ctx in contexts if cells.get((ctx, conc))]
            if rates and None not in rates and len(rates) == len(contexts):
                means.append((sum(rates) / len(rates), name))
        best_overall = f"{max(means)[1]} ({max(means)[0]:.1f})" if means else "-"
        row = [str(conc), best_overall]
        for ctx in contexts:
            candidates = [
                (cells[(ctx, conc)]["output_tok_s"], name)
                for name, cells in zip(names, maps)
                if cells.get((ctx, conc)) and cells[(ctx, conc)]["output_tok_s"] is not None
                and not cells[(ctx, conc)]["has_errors"]
            ]
            row.append(f"{max(candidates)[1]} ({max(candidates)[0]:.1f})" if candidates else "-")
        rows.append(row)
    header = ["C", "best overall (mean tok/s)"] + [f"ctx {ctx}" for ctx in contexts]
    return "## Best config per concurrency (output tok/s)\n\n" + markdown_table(header, rows)


def _runs_section(runs: list[dict], names: list[str]) -> str:
    rows = [
        [
            name,
            r["status"],
            r["started_at"],
            str(r.get("profile") or "-"),
            str(r.get("algorithm") or "-"),
            str(r.get("budget") if r.get("budget") is not None else "-"),
            str(r.get("topk") if r.get("topk") is not None else "-"),
            str(r.get("model") or "-"),
            (r.get("git_sha") or "unknown")[:12],
            str(r.get("snapshot_id") or "-"),
        ]
        for name, r in zip(names, runs)
    ]
    header = ["run", "status", "started (UTC)", "profile", "algorithm", "budget", "topk", "model", "git", "snapshot"]
    return "## Runs\n\n" + markdown_table(header, rows)


def _side_by_side(runs: list[dict], names: list[str]) -> str:
    maps = [_cell_map(r) for r in runs]
    rows = []
    for key in _all_keys(runs):
        base = maps[0].get(key, {}).get("output_tok_s")
        row = [str(key[0]), str(key[1])]
        for cells in maps:
            rate = cells.get(key, {}).get("output_tok_s")
            text = _fmt(rate)
            if base and rate is not None and cells is not maps[0]:
                text += f" ({rate / base:.2f}x)"
            if cells.get(key, {}).get("has_errors"):
                text += " !"
            row.append(text)
        rows.append(row)
    note = f"Ratios are against {names[0]}; `!` marks a cell with failed requests.\n\n" if len(runs) > 1 else ""
    return "## Output tok/s side by side\n\n" + note + markdown_table(["ctx", "C"] + names, rows)


def _run_detail(run: dict, name: str) -> str:
    rows = []
    for c in run["cells"]:
        rows.append(
            [
                str(c["context"]),
                str(c["concurrency"]),
                f"{c['ok']}/{c['requests']}",
                _fmt(c["output_tok_s"]),
                _fmt(c["request_tok_s"]["mean"]),
                f"{_fmt(c['ttft_ms']['p50'])} / {_fmt(c['ttft_ms']['p99'])}",
                f"{_fmt(c['itl_ms']['p50'])} / {_fmt(c['itl_ms']['p99'])}",
                f"{_fmt(c['tpot_ms']['mean'])} / {_fmt(c['tpot_ms']['p50'])}",
                _fmt(c["accept_length"], 2),
                _fmt(c["server_avg_spec_accept_length"], 2),
                _flags(c),
            ]
        )
    header = [
        "ctx", "C", "ok", "out tok/s", "req tok/s", "TTFT ms p50/p99", "ITL ms p50/p99",
        "TPOT ms mean/p50", "accept", "server accept", "flags",
    ]
    text = f"### {name}\n\n"
    if run.get("failure"):
        text += f"Run failed: {run['failure']}\n\n"
    return text + (markdown_table(header, rows) if rows else "No matrix cells.\n")


def _eval_section(runs: list[dict], names: list[str]) -> str:
    columns = []  # (title, {task: passed}, summary)
    for name, run in zip(names, runs):
        for endpoint, result in ((run.get("coding_eval") or {}).get("endpoints") or {}).items():
            columns.append((f"{name} {endpoint}", {r["task"]: r for r in result["results"]}, result))
    if not columns:
        return ""
    tasks = sorted({task for _, results, _ in columns for task in results})
    rows = [[task] + [("pass" if res[task]["passed"] else "FAIL") if task in res else "-" for _, res, _ in columns]
            for task in tasks]
    rows.append(["**pass@1**"] + [f"**{s['passed']}/{s['total']}**" for _, _, s in columns])
    rows.append(["tok/s during eval"] + [_fmt(s["output_tok_s"]) for _, _, s in columns])
    rows.append(["accept length"] + [_fmt(s.get("accept_length"), 2) for _, _, s in columns])
    sandbox = sorted({(r.get("coding_eval") or {}).get("sandbox") for r in runs} - {None})
    text = "## Coding eval (pass@1)\n\n" + markdown_table(["task"] + [title for title, _, _ in columns], rows)
    failures = [
        f"- {title} / {task}: {result['reason']}"
        for title, results, _ in columns
        for task, result in sorted(results.items())
        if not result["passed"]
    ]
    if failures:
        text += "\nWhy tasks failed:\n\n" + "\n".join(failures) + "\n"
    return text + "".join(f"\nSandbox: {note}\n" for note in sandbox)


def render_markdown(runs: list[dict], plots: list[Path]) -> str:
    names = run_names(runs)
    parts = [f"# Benchmark report\n\nGenerated {utc_now()} from {len(runs)} run(s).\n", _runs_section(runs, names)]
    if any(r["cells"] for r in runs):
        parts.append(_side_by_side(runs, names))
        if len(runs) > 1:
            parts.append(winners_markdown(runs))
        parts.append("## Plots\n\n" + "".join(f"![{p.stem}]({p.name})\n\n" for p in plots))
        parts.append(
            "## Cells\n\naccept = sum completion_tokens / sum spec_verify_ct from /generate meta_info; "
            "server accept = /server_info avg_spec_accept_length after the cell. ITL is the gap between "
            "streamed chunks (one chunk per verify step); TPOT = (latency - TTFT) / (tokens - 1).\n\n"
            + "\n".join(_run_detail(r, n) for r, n in zip(runs, names))
        )
    evaluation = _eval_section(runs, names)
    if evaluation:
        parts.append(evaluation)
    return "\n".join(parts)


@contextlib.contextmanager
def _folder_removed_on_failure(folder: Path):
    """Create `folder` (and its missing parents) for the block; when the block fails, remove
    what was created here, so no empty or half-filled new folder is left behind."""
    created = [f for f in (folder, *folder.parents) if not f.exists()]
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise UserError(f"cannot create the report folder {folder}: {err.strerror}") from None
        yield
    except BaseException:
        if created:
            shutil.rmtree(created[-1], ignore_errors=True)
        raise


def render_report(runs: list[dict], out_dir: Path) -> list[Path]:
    """Write report.md and the plots into out_dir, each file replaced whole; return the files written."""
    from k26_ddtree.bench.plots import write_plots

    if not runs:
        raise UserError("the results files hold no runs")
    with _folder_removed_on_failure(out_dir):
        try:
            plots = write_plots(runs, run_names(runs), out_dir) if any(r["cells"] for r in runs) else []
        except OSError as err:
            raise UserError(f"cannot write the plots into {out_dir}: {err.strerror or err}") from None
        report = out_dir / "report.md"
        atomic.write_text(report, render_markdown(runs, plots))
    return [report, *plots]

"""PNG plots for `bench report` (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

import io
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from k26_ddtree import atomic  # noqa: E402

DPI = 120


def color(index: int):
    """One color per run across every panel and plot."""
    return plt.get_cmap("tab10")(index % 10)


def save_png(fig, path: Path) -> Path:
    """Write and close `fig` as a PNG at `path`, whole and with report.md's permissions
    (atomic.replace: a temp file beside it, then os.replace). Raises OSError."""
    png = io.BytesIO()
    try:
        fig.savefig(png, format="png", dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(fig)
    atomic.replace(path, png.getvalue())
    return path


def log2_axis(ax, ticks: list[int]) -> None:
    """An x axis of powers of two (concurrency, budget) with exactly `ticks` labelled."""
    if len(ticks) > 1:
        ax.set_xscale("log", base=2)
    ax.set_xticks(ticks, [str(v) for v in ticks])


def label_panel(ax, title: str, xlabel: str, ylabel: str) -> None:
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)


def _legend(ax, drawn: bool) -> None:
    """The legend of a panel, or, where nothing could be drawn, a note saying so (a legend of
    nothing is a matplotlib warning, and a blank panel reads like a broken plot)."""
    if drawn:
        ax.legend(fontsize=8)
    else:
        ax.set_yticks([])
        ax.text(0.5, 0.5, "no cell produced tokens", transform=ax.transAxes, ha="center", va="center",
                color="gray")


def _contexts(runs: list[dict]) -> list[int]:
    return sorted({c["context"] for r in runs for c in r["cells"]})


def throughput_plot(runs: list[dict], names: list[str], path: Path) -> Path:
    """Output tok/s vs concurrency, one panel per context, one line per run."""
    contexts = _contexts(runs)
    columns = min(len(contexts), 2)
    rows = math.ceil(len(contexts) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.4 * columns, 4.2 * rows), squeeze=False)
    for ax, ctx in zip(axes.flat, contexts):
        drawn = False
        for index, (name, run) in enumerate(zip(names, runs)):
            cells = sorted((c for c in run["cells"] if c["context"] == ctx and c["output_tok_s"] is not None),
                           key=lambda c: c["concurrency"])
            if not cells:
                continue
            drawn = True
            xs = [c["concurrency"] for c in cells]
            ax.plot(xs, [c["output_tok_s"] for c in cells], marker="o", label=name, color=color(index))
            bad = [c for c in cells if c["has_errors"]]
            if bad:
                ax.scatter([c["concurrency"] for c in bad], [c["output_tok_s"] for c in bad],
                           marker="x", s=90, color="red", zorder=5)
        log2_axis(ax, sorted({c["concurrency"] for r in runs for c in r["cells"] if c["context"] == ctx}))
        label_panel(ax, f"context {ctx} tokens", "concurrency", "output tok/s")
        _legend(ax, drawn)
    for ax in list(axes.flat)[len(contexts):]:
        ax.set_visible(False)
    fig.suptitle("Output throughput vs concurrency (red x: cell with errors)")
    fig.tight_layout()
    return save_png(fig, path)


def _grouped_bars(keys: list[tuple[int, int]], names: list[str], runs: list[dict], value):
    """Per run: (name, x positions, values, bar width, color) for bars grouped by cell key."""
    width = 0.8 / max(1, len(runs))
    for index, (name, run) in enumerate(zip(names, runs)):
        cells = {(c["context"], c["concurrency"]): c for c in run["cells"]}
        xs, ys = [], []
        for position, key in enumerate(keys):
            v = value(cells[key]) if key in cells else None
            if v is not None:
                xs.append(position + (index - (len(runs) - 1) / 2) * width)
                ys.append(v)
        yield name, xs, ys, width, color(index)


def acceptance_plot(runs: list[dict], names: list[str], path: Path) -> Path:
    """Acceptance length per cell: bars from meta_info, black ticks for the server's average."""
    keys = sorted({(c["context"], c["concurrency"]) for r in runs for c in r["cells"]})
    fig, ax = plt.subplots(figsize=(max(6.4, 0.55 * len(keys) * max(1, len(runs)) + 2), 4.4))
    for name, xs, ys, width, color in _grouped_bars(keys, names, runs, lambda c: c["accept_length"]):
        ax.bar(xs, ys, width=width, label=name, color=color)
    server_label = "server avg_spec_accept_length"
    for _, xs, ys, _, _ in _grouped_bars(keys, names, runs, lambda c: c["server_avg_spec_accept_length"]):
        ax.scatter(xs, ys, marker="_", s=260, color="black", linewidths=2, label=server_label, zorder=5)
        server_label = None
    ax.set_xticks(range(len(keys)), [f"{ctx}/C{conc}" for ctx, conc in keys], rotation=45, ha="right")
    ax.set_xlabel("context / concurrency")
    ax.set_ylabel("accepted tokens per verify step")
    ax.set_title("Acceptance length per cell (sum completion_tokens / sum spec_verify_ct)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_png(fig, path)


def single_user_plot(runs: list[dict], names: list[str], path: Path) -> Path:
    """Per-request tok/s at the lowest concurrency (C=1 in the default matrix) per context."""
    lowest = min(c["concurrency"] for r in runs for c in r["cells"])
    keys = sorted({(c["context"], lowest) for r in runs for c in r["cells"] if c["concurrency"] == lowest})
    fig, ax = plt.subplots(figsize=(max(6.4, 0.6 * len(keys) * max(1, len(runs)) + 2), 4.2))
    drawn = False
    for name, xs, ys, width, color in _grouped_bars(keys, names, runs, lambda c: c["request_tok_s"]["mean"]):
        ax.bar(xs, ys, width=width, label=name, color=color)
        drawn = drawn or bool(ys)
    ax.set_xticks(range(len(keys)), [str(ctx) for ctx, _ in keys])
    ax.set_xlabel("context tokens")
    ax.set_ylabel("tok/s per request")
    ax.set_title(f"Single-stream speed: per-request tok/s at C={lowest}")
    ax.grid(True, axis="y", alpha=0.3)
    _legend(ax, drawn)
    fig.tight_layout()
    return save_png(fig, path)


def write_plots(runs: list[dict], names: list[str], out_dir: Path) -> list[Path]:
    written = [
        throughput_plot(runs, names, out_dir / "throughput.png"),
        single_user_plot(runs, names, out_dir / "single_stream.png"),
    ]
    if any(c["accept_length"] is not None for r in runs for c in r["cells"]):
        written.append(acceptance_plot(runs, names, out_dir / "acceptance.png"))
    return written

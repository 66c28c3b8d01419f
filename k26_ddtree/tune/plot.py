"""tune.png in `bench report`'s style: predicted tok/s per concurrency as a ratio to the DFlash chain, and the
trace's acceptance per shape."""

from __future__ import annotations

from pathlib import Path

from k26_ddtree.bench.plots import color, label_panel, log2_axis, plt, save_png
from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.tune.estimate import TOPKS, chain
from k26_ddtree.tune.predict import Config, Plan


def _spine(plan: Plan) -> str:
    return "spine on" if plan.spine else "spine off"


def _throughput(ax, chosen: Plan, others: list[Plan], chain_config: Config, ar_tok_s: dict[int, float]) -> None:
    """tok/s per C as a ratio to the DFlash chain's at that C, on linear axes: the configs differ by
    percents, which a log scale over the C range flattens. The winners, the other spine's best and
    AR below; the schedule (every C's best) on top, labelled with its text."""
    levels = sorted(chosen.ranked)
    base = {c: q.tok_s for c in levels for q in chosen.ranked[c] if q.config == chain_config}
    levels = [c for c in levels if base.get(c)]
    # The chain is the baseline line at 1: drawn once.
    winners = [c for c in dict.fromkeys(chosen.best(c).config for c in levels) if c != chain_config]
    for index, config in enumerate(winners):
        points = {c: q.tok_s / base[c] for c in levels for q in chosen.ranked[c] if q.config == config}
        xs = sorted(points)
        ax.plot(xs, [points[c] for c in xs], marker="o", markersize=4, linewidth=1.2, label=config.name,
                color=color(index))
    for other in others:
        ax.plot(levels, [other.best(c).tok_s / base[c] for c in levels], color="gray", linestyle=":", marker=".",
                label=f"best per C, {_spine(other)}")
    xs = [c for c in levels if c in ar_tok_s]
    if xs:
        ax.plot(xs, [ar_tok_s[c] / base[c] for c in xs], linestyle="--", marker="x", color="gray",
                label="AR (measured)")
    ax.axhline(1.0, color="black", linewidth=0.8, label=f"{chain_config.name} = 1")
    schedule = [chosen.best(c).tok_s / base[c] for c in levels]
    ax.plot(levels, schedule, color="black", linewidth=2.5, marker="s", markersize=6, zorder=10,
            label=f"schedule {chosen.schedule()}")
    for c, ratio in zip(levels, schedule):
        config = chosen.best(c).config
        ax.annotate("chain" if config.dflash else config.token, (c, ratio), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=8, zorder=11)
    log2_axis(ax, levels)
    label_panel(ax, f"Predicted tok/s as a ratio to the DFlash chain's, per concurrency ({_spine(chosen)})",
                "concurrency C", "tok/s / DFlash chain tok/s")
    ax.legend(fontsize=7)


def _acceptance(ax, acceptance: dict[TreeShape, float], depth: int, spine: bool) -> None:
    # Widest topk first: the narrow ones share the small budgets' values and would hide beneath.
    for index, topk in reversed(list(enumerate(TOPKS))):
        shapes = sorted((s for s in acceptance if s.topk == topk and s.spine == spine), key=lambda s: s.budget)
        if shapes:
            # A marker on every point: a topk of one searched budget is a point, not a line.
            ax.plot([s.budget for s in shapes], [acceptance[s] for s in shapes], label=f"topk {topk}",
                    color=color(index), marker="o", markersize=3)
    ax.axhline(acceptance[chain(depth)], linestyle="--", color="gray", label=f"chain b{depth}k1")
    log2_axis(ax, [b for b in (1, 2, 4, 8, 16, 32, 64) if any(s.budget == b for s in acceptance)])
    label_panel(ax, f"Acceptance replayed from the trace (spine {'on' if spine else 'off'})",
                "budget (tree nodes)", "committed tokens per step")
    ax.legend(fontsize=8)


def write_plot(path: Path, chosen: Plan, others: list[Plan], chain_config: Config,
               acceptance: dict[TreeShape, float], depth: int, ar_tok_s: dict[int, float]) -> Path:
    fig, axes = plt.subplots(1, 2, figsize=(12.8, 4.6))
    _throughput(axes[0], chosen, others, chain_config, ar_tok_s)
    _acceptance(axes[1], acceptance, depth, chosen.spine)
    fig.suptitle("k26-deploy tune: predicted from a trace and bench step times (not measured)")
    fig.tight_layout()
    return save_png(fig, path)

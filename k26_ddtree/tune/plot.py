"""tune.png in `bench report`'s style: predicted tok/s per concurrency, and the trace's acceptance per shape."""

from __future__ import annotations

from pathlib import Path

from k26_ddtree.bench.plots import color, label_panel, log2_axis, plt, save_png
from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.tune.estimate import TOPKS, chain
from k26_ddtree.tune.predict import Config, Plan


def _spine(plan: Plan) -> str:
    return "spine on" if plan.spine else "spine off"


def _throughput(ax, chosen: Plan, others: list[Plan], chain_config: Config, ar_tok_s: dict[int, float]) -> None:
    """The chosen plan's winners and the chain over every C, the schedule's envelope, the other
    spine's envelope and AR as measured."""
    levels = sorted(chosen.ranked)
    winners = list(dict.fromkeys([chosen.best(c).config for c in levels] + [chain_config]))
    for index, config in enumerate(winners):
        points = {c: q.tok_s for c in levels for q in chosen.ranked[c] if q.config == config}
        xs = sorted(points)
        ax.plot(xs, [points[c] for c in xs], marker="o", label=config.name, color=color(index))
    ax.plot(levels, [chosen.best(c).tok_s for c in levels], color="black", linewidth=4, alpha=0.25,
            label=f"schedule {chosen.schedule()}")
    for other in others:
        ax.plot(levels, [other.best(c).tok_s for c in levels], color="black", linestyle=":",
                label=f"best per C, {_spine(other)}")
    xs = [c for c in levels if c in ar_tok_s]
    if xs:
        ax.plot(xs, [ar_tok_s[c] for c in xs], linestyle="--", marker="x", color="gray", label="AR (measured)")
    log2_axis(ax, levels)
    ax.set_yscale("log")  # C=1 and C=64 differ by two orders of magnitude
    label_panel(ax, f"Predicted output tok/s per concurrency ({_spine(chosen)})", "concurrency", "output tok/s")
    ax.legend(fontsize=8)


def _acceptance(ax, acceptance: dict[TreeShape, float], depth: int, spine: bool) -> None:
    for index, topk in enumerate(TOPKS):
        shapes = sorted((s for s in acceptance if s.topk == topk and s.spine == spine), key=lambda s: s.budget)
        if shapes:
            ax.plot([s.budget for s in shapes], [acceptance[s] for s in shapes], label=f"topk {topk}",
                    color=color(index))
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

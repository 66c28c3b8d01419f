"""What `tune` prints (the table, the best config per C, the schedule) and the schedule file it writes."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from k26_ddtree import __version__
from k26_ddtree.bench.report import markdown_table
from k26_ddtree.bench.results import git_sha, utc_now
from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.tune.costs import Costs
from k26_ddtree.tune.estimate import Replay, chain
from k26_ddtree.tune.leads import LEVEL, Lead
from k26_ddtree.tune.predict import Config, Plan, Prediction, shares
from k26_ddtree.tune.schedule_file import SCHEMA

SERVE_SCHEDULE = "sudo k26-deploy reconfigure --schedule-file FILE"


@dataclass(frozen=True)
class Outcome:
    trace: Path
    header: dict
    replay: Replay
    acceptance: dict[TreeShape, float]
    costs: Costs
    chosen: Plan
    others: list[Plan]
    budgets: range
    spine_option: str
    leads: dict[int, Lead]


def chain_config(o: Outcome) -> Config:
    """The chain to show beside the winners: the plain DFlash one where it was measured, else as a tree."""
    depth = o.replay.depth
    if any(q.config.dflash for ranked in o.chosen.ranked.values() for q in ranked):
        return Config(chain(depth), dflash=True)
    return Config(TreeShape(depth, 1, o.chosen.spine))


def _lookup(plan: Plan) -> dict[tuple[int, Config], Prediction]:
    return {(c, q.config): q for c, ranked in plan.ranked.items() for q in ranked}


def table(o: Outcome, top: int) -> str:
    """config x concurrency: the top configs per C, the chain and AR, best marked *."""
    levels = sorted(o.chosen.ranked)
    rows: list[Config] = []
    for c in levels:
        rows += [q.config for q in o.chosen.ranked[c][:top] if q.config not in rows]
    chain_row = chain_config(o)
    if chain_row not in rows:
        rows.append(chain_row)
    found = _lookup(o.chosen)
    header = ["config", "accept"] + [f"C={c} {what}" for c in levels for what in ("step ms", "tok/s")]
    lines = []
    for config in rows:
        cells = [config.name, f"{o.acceptance[config.shape]:.2f}"]
        for c in levels:
            q = found.get((c, config))
            best = " *" if q is not None and q.config == o.chosen.best(c).config else ""
            cells += ["-", "-"] if q is None else [f"{1000 * q.step_s:.1f}", f"{q.tok_s:.1f}{best}"]
        lines.append(cells)
    if any(c in o.costs.ar_tok_s for c in levels):
        ar = ["AR (measured)", "1.00"]
        for c in levels:
            rate = o.costs.ar_tok_s.get(c)
            ar += ["-", "-"] if rate is None else [f"{1000 * c / rate:.1f}", f"{rate:.1f}"]
        lines.append(ar)
    return markdown_table(header, lines)


def _spine_line(o: Outcome) -> str:
    on_off = "on" if o.chosen.spine else "off"
    if not o.others:
        return f"Spine: {on_off} for every bucket (--spine {o.spine_option})."
    plans = [o.chosen, *o.others]
    kept = ", ".join(f"{'on' if p.spine else 'off'} {100 * share:.1f}%" for p, share in zip(plans, shares(plans)))
    other = "; ".join(f"spine {'on' if p.spine else 'off'} would schedule {p.schedule()}" for p in o.others)
    return f"Spine: {on_off} for every bucket, the higher mean share of the best tok/s per C ({kept}); {other}."


def summary(o: Outcome) -> str:
    lines = ["Best config per concurrency (each command serves that one config at every batch size):"]
    for c in sorted(o.chosen.ranked):
        best, second = o.chosen.best(c), o.chosen.runner_up(c)
        runner = f", runner-up {second.config.name} {second.tok_s:.1f} tok/s" if second else ""
        lines.append(f"  C={c}: {best.config.name} {best.tok_s:.1f} tok/s{runner}")
        if c in o.leads:
            lines.append(f"        lead {o.leads[c].text(o.replay.requests)}")
        close = _within_spread(o, c)
        if close:
            rival, margin, spread = close
            lines.append(f"        {100 * margin:.1f}% over {rival.config.name}, inside the {100 * spread:.0f}% that "
                         "repeated cost runs at this C differ by: bench both before you keep one")
        lines.append(f"        {best.config.reconfigure()}")
    lines.append(_spine_line(o))
    lines += _schedule_lines(o)
    return "\n".join(lines) + "\n"


def _schedule_lines(o: Outcome) -> list[str]:
    """The schedule as `reconfigure --schedule` takes it, and the rule that made its buckets."""
    plan = o.chosen
    if all(config.dflash for _, config, _ in plan.buckets()):
        return ["Schedule: none: the plain DFlash chain is best at every C; serve DFLASH "
                "(sudo k26-deploy reconfigure --set speculative.algorithm=DFLASH)"]
    spine = "true" if plan.spine else "false"
    starts = ", ".join(f"{start} (won at C={'/'.join(map(str, won))})" for start, _, won in plan.buckets())
    return [f"Schedule: {plan.schedule()}",
            f"  serve it: sudo k26-deploy reconfigure --schedule {plan.schedule()} --set speculative.spine={spine}"
            f" (or `{SERVE_SCHEDULE}`)",
            f"  buckets start at batch sizes {starts}: a bucket won at C starts at the geometric midpoint between "
            "the C planned before it and C, since a server at C runs some steps at smaller batches"]


def _within_spread(o: Outcome, c: int) -> tuple[Prediction, float, float] | None:
    """(the nearest rival costed from another measurement, its margin, the costs' spread at C)
    where the margin is the smaller: the costs measured there cannot rank the two. A rival of the
    best's own budget shares its step time, so no spread of the costs moves them apart."""
    ranked, spread = o.chosen.ranked[c], o.costs.spread.get(c)
    best = ranked[0]
    rival = next((q for q in ranked[1:] if _cost_point(q) != _cost_point(best)), None)
    if rival is None or spread is None or rival.tok_s <= 0:
        return None
    margin = best.tok_s / rival.tok_s - 1
    return (rival, margin, spread) if margin < spread else None


def _rival_name(o: Outcome, c: int) -> str | None:
    close = _within_spread(o, c)
    return close[0].config.name if close else None


def _cost_point(q: Prediction) -> int | None:
    """The budget whose step times cost a prediction; None for the chain, costed from DFLASH's."""
    return None if q.config.dflash else q.config.shape.budget


def notes(o: Outcome) -> list[str]:
    rep, budgets = o.replay, o.budgets
    out = [f"{rep.steps} traced steps of {rep.requests} requests; {rep.short} short (their request's known text "
           f"ends before D + 1 = {rep.depth + 1} tokens: a step there commits at most what is known)",
           f"the drafter's first choice at depth 1 is the committed token in {100 * rep.first_hits / rep.steps:.1f}% "
           "of the steps",
           f"acceptance counted as SGLang does, completion tokens per verify step: the per-step means x "
           f"{rep.served_scale:.4f} for the prefill's first token of the whole requests traced",
           f"step times: {o.costs.source}, mean over contexts {', '.join(map(str, o.costs.contexts))}; "
           f"budgets searched {budgets.start}-{budgets.stop - 1}"]
    if not o.costs.chain:
        out.append("the plain DFlash chain is not costed (no DFLASH run in the costs); "
                   f"b{rep.depth}k1, the chain as a tree, stands in for it where budget {rep.depth} is searched")
    return out + list(o.costs.notes)


def _prediction(q: Prediction | None) -> dict | None:
    if q is None:
        return None
    return {**_config(q.config), "acceptance": q.acceptance, "step_ms": 1000 * q.step_s, "tok_s": q.tok_s}


def _config(config: Config) -> dict:
    shape = config.shape
    return {"config": config.name, "budget": shape.budget, "topk": shape.topk,
            "spine": None if config.dflash else shape.spine, "dflash_chain": config.dflash, "bucket": config.token}


def _lead_doc(o: Outcome, c: int) -> dict | None:
    lead = o.leads.get(c)
    if lead is None:
        return None
    return {"lead": lead.lead, "low": lead.low, "high": lead.high, "level": LEVEL,
            "separated": lead.separated(o.replay.requests), "resampled": "requests"}


def _plan_doc(p: Plan, share: float) -> dict:
    return {"schedule": p.schedule(), "mean_share_of_best": share,
            "best": {str(c): _prediction(p.best(c)) for c in sorted(p.ranked)}}


def document(o: Outcome) -> dict:
    """The schedule file (`reconfigure --schedule-file` reads "schedule" and "spine",
    tune/schedule_file.py), with the table and provenance."""
    levels = sorted(o.chosen.ranked)
    plans = [o.chosen, *o.others]
    predictions: dict[Config, dict] = {}
    for p in plans:
        for (c, config), q in _lookup(p).items():
            row = predictions.setdefault(config, {**_config(config), "acceptance": q.acceptance, "predicted": {}})
            row["predicted"][str(c)] = {"step_ms": 1000 * q.step_s, "tok_s": q.tok_s}
    return {
        "schema": SCHEMA,
        "schedule": o.chosen.schedule(),
        "spine": o.chosen.spine,
        "applies_with": SERVE_SCHEDULE,
        "buckets": [{"from_batch_size": start, **_config(config), "won_at_concurrency": won}
                    for start, config, won in o.chosen.buckets()],
        "per_concurrency": [{"concurrency": c, "best": _prediction(o.chosen.best(c)),
                             "runner_up": _prediction(o.chosen.runner_up(c)),
                             "cost_spread": o.costs.spread.get(c),
                             "within_cost_spread_of": _rival_name(o, c),
                             "lead_over_runner_up": _lead_doc(o, c),
                             "reconfigure": o.chosen.best(c).config.reconfigure()} for c in levels],
        "spine_choice": {"option": o.spine_option, "chosen": "on" if o.chosen.spine else "off",
                         "plans": {("on" if p.spine else "off"): _plan_doc(p, share)
                                   for p, share in zip(plans, shares(plans))}},
        "predictions": list(predictions.values()),
        "acceptance": {shape.name: value for shape, value in o.acceptance.items()},
        "measured": {"ar_tok_s": {str(c): v for c, v in sorted(o.costs.ar_tok_s.items())},
                     "dflash_step_ms": {str(c): 1000 * v for c, v in sorted(o.costs.chain.items())},
                     "ddtree_step_ms": {str(c): {str(b): 1000 * v for b, v in sorted(points.items())}
                                        for c, points in sorted(o.costs.tree.items())}},
        "provenance": {
            "generated_at": utc_now(),
            "tool": f"k26-deploy {__version__}",
            "git_sha": git_sha(),
            "predicted": "acceptance replayed from the trace, step times from the bench runs; not served or measured",
            "trace": {"path": str(o.trace), "header": o.header, "steps": o.replay.steps,
                      "requests": o.replay.requests, "short_steps": o.replay.short,
                      "first_choice_committed_steps": o.replay.first_hits},
            "costs": {"path": str(o.costs.source), "contexts": list(o.costs.contexts),
                      "runs": [asdict(run) for run in o.costs.runs]},
            "search": {"concurrency": levels, "min_budget": o.budgets.start, "max_budget": o.budgets.stop - 1,
                       "spine": o.spine_option},
            "notes": notes(o),
        },
    }

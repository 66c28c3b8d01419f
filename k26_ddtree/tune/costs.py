"""Seconds per decode step at concurrency C and tree budget, from `k26-deploy bench` runs on the live server.

A bench cell at concurrency C commits `accept_length` tokens per request per step at an
aggregate `output_tok_s`, so its batch takes C * accept_length / output_tok_s seconds per
step, whatever the acceptance was. The step is a draft forward (fixed per request), a
tree build and a target verify of budget + 1 tokens per request; the verify dominates on
K2.6, and it grows with the tokens in the batch, C * (budget + 1). So the step time is a
function of (C, budget): topk only changes the drafter's top-K and the builder's sort a
little, and acceptance changes what a step commits, not what it costs. Between measured
budgets at one C the time is interpolated linearly in the tokens verified per request
(budget + 1), and never extrapolated. Measure the cells with `bench run --steady` (a closed
loop, as a server under steady load runs): its time holds the prefills of the requests that
replace finished ones, as serving does, while a default cell's also holds its ramp and tail
(88 ms against a served 61 ms for DFLASH at C=64 on the proving ground). Limits: on EP/MoE the
verify cost follows how many distinct experts the batch routes to, which depends on the text.

DDTree runs (a budget recorded; early files label them DFLASH with a budget) give the
tree points; a DFLASH run without one is the plain chain, schedule `0`, costed as served;
an AR run is shown as the measured baseline only, never a tree point: its step has no
draft forward, so a line from it to the first tree point would under-cost small trees.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, median

from k26_ddtree.bench.results import load_results
from k26_ddtree.errors import UserError

TREE, CHAIN, AR = "DDTREE", "DFLASH", "AR"


@dataclass(frozen=True)
class RunUsed:
    run_id: str
    label: str
    kind: str  # TREE, CHAIN or AR
    budget: int | None
    topk: int | None


@dataclass(frozen=True)
class Costs:
    """Step seconds by concurrency: tree[C][budget], chain[C]; ar_tok_s[C] is AR's measured rate."""

    source: Path
    contexts: tuple[int, ...]
    tree: dict[int, dict[int, float]]
    chain: dict[int, float]
    ar_tok_s: dict[int, float]
    models: frozenset[str]  # every name the runs' server gave its model (path, served name)
    block_sizes: frozenset[int]
    runs: tuple[RunUsed, ...]
    notes: tuple[str, ...]
    # Per C, the widest (max - min) / min among the step times measured more than once at that C
    # (one budget's runs, or DFLASH's): how far apart two configs must be before the costs rank them.
    spread: dict[int, float]

    def concurrencies(self) -> list[int]:
        return sorted(self.tree)

    def budgets(self, concurrency: int) -> list[int]:
        return sorted(self.tree.get(concurrency, {}))

    def require(self, concurrencies: list[int], lowest: int, highest: int) -> None:
        """UserError naming the first (budget, C) of the search that no measurement covers."""
        for c in concurrencies:
            measured = self.budgets(c)
            if not measured:
                have = ", ".join(map(str, self.concurrencies())) or "none"
                raise UserError(f"costs missing at C={c}: {self.source} has DDTree step times at C={have}; "
                                f"bench C={c} too, or leave it out of --concurrency")
            missing = lowest if lowest < measured[0] else highest if highest > measured[-1] else None
            if missing is not None:
                raise UserError(
                    f"costs missing for budget {missing} at C={c}: {self.source} measured budgets "
                    f"{', '.join(map(str, measured))} there and tune never extrapolates; sweep budget {missing} "
                    f"too, or search --min-budget {measured[0]} --max-budget {measured[-1]}")

    def step_s(self, concurrency: int, budget: int) -> float:
        """The step time at a budget inside the measured range (require() first)."""
        return interpolate(self.tree[concurrency], budget)


def bracket(points: dict[int, float], budget: int) -> tuple[int, ...]:
    """The measured budgets a step time at `budget` comes from: itself, or the two around it;
    ValueError outside the measured range (tune never extrapolates)."""
    measured = sorted(points)
    if not measured or not measured[0] <= budget <= measured[-1]:
        raise ValueError(f"budget {budget} is outside the measured budgets {measured}")
    at = bisect.bisect_left(measured, budget)
    return (budget,) if measured[at] == budget else (measured[at - 1], measured[at])


def interpolate(points: dict[int, float], budget: int) -> float:
    """The step time at `budget` from step times at measured budgets around it (never outside them)."""
    used = bracket(points, budget)
    if len(used) == 1:
        return points[budget]
    low, high = used
    # Linear in tokens verified per request, budget + 1: the same line as in the budget.
    share = (budget - low) / (high - low)
    return points[low] + share * (points[high] - points[low])


def _kind(run: dict, where: str) -> str | None:
    algorithm = str(run.get("algorithm") or "").upper()
    budget = run.get("budget")
    if algorithm == AR:
        return AR
    if algorithm in (TREE, CHAIN) and budget is not None:
        return TREE
    return CHAIN if algorithm == CHAIN else None


def _cell_step_s(cell: dict, kind: str, where: str) -> float | None:
    """Seconds per batch step of one cell, or None when the cell cannot say (failed requests, cut short).
    load_results has checked every field read here."""
    rate = cell["output_tok_s"]
    accept = 1.0 if kind == AR else cell["accept_length"]
    if cell["has_errors"] or cell["interrupted"] or not rate or not accept:
        return None
    return cell["concurrency"] * accept / rate


def _info(run: dict) -> dict:
    return run["server_info"] if isinstance(run.get("server_info"), dict) else {}


def _model_path(run: dict):
    return _info(run).get("model_path") or run.get("model")


def _names(run: dict) -> set[str]:
    """Every name the run's server gave its model: a trace may carry any of them."""
    found = (run.get("model"), _info(run).get("model_path"), _info(run).get("served_model_name"))
    return {str(name).rstrip("/") for name in found if name}


def _mixed(what: str, names: list[str], path: Path) -> UserError:
    return UserError(f"{path} mixes runs of different {what} ({', '.join(sorted(names))}): give one server's sweep")


def _check_one_server(runs: list[dict], path: Path) -> None:
    profiles = {run["profile"] for run in runs if run.get("profile")}
    if len(profiles) > 1:
        raise _mixed("profiles", list(profiles), path)
    # The path names the weights; the served name is a label two models can share.
    paths = {str(_model_path(run)).rstrip("/") for run in runs if _model_path(run)}
    if len(paths) > 1:
        raise _mixed("models", list(paths), path)


def _samples(used: list[tuple[int, dict, str]], contexts: tuple[int, ...], path: Path,
             notes: list[str]) -> dict[tuple[str, int, int | None], list[float]]:
    """Step seconds of every (kind, C, budget), one per run that has a clean cell at every context."""
    samples: dict[tuple[str, int, int | None], list[float]] = {}
    for number, run, kind in used:
        where = f"{path}: run {number} ({run['label']})"
        by_key = {(c["context"], c["concurrency"]): c for c in run["cells"]}
        for c in sorted({c["concurrency"] for c in run["cells"]}):
            times = [_cell_step_s(by_key[(ctx, c)], kind, f"{where} cell ctx {ctx} C {c}")
                     if (ctx, c) in by_key else None for ctx in contexts]
            if None in times:
                notes.append(f"run {run['label']} at C={c} not used: no clean cell at every context "
                             f"{', '.join(map(str, contexts))} (failed requests, interrupted or not measured)")
                continue
            # Equal weight per context: the traffic is taken as spread evenly over them.
            samples.setdefault((kind, c, run["budget"] if kind == TREE else None), []).append(fmean(times))
    return samples


def load_costs(path: Path, contexts: tuple[int, ...] | None = None) -> Costs:
    """The cost model of a bench results file; UserError for a file that is not one or holds no tree point."""
    runs = load_results(path)["runs"]
    kinds = [(number, run, _kind(run, f"{path}: run {number}")) for number, run in enumerate(runs, 1)]
    used = [(number, run, kind) for number, run, kind in kinds if kind is not None]
    notes = [f"run {run['label']} not used: algorithm {run.get('algorithm')} is neither DDTree, DFLASH nor AR"
             for _, run, kind in kinds if kind is None]
    costing = [run for _, run, kind in used if kind != AR]
    if not any(kind == TREE for _, _, kind in used):
        raise UserError(f"{path} holds no DDTree run (a bench run with a budget): nothing to cost trees from")
    _check_one_server([run for _, run, _ in used], path)
    measured = [{c["context"] for c in run["cells"]} for run in costing]
    chosen = tuple(sorted(contexts if contexts else set.intersection(*measured)))
    if not chosen:
        raise UserError(f"{path}: the runs share no context; pick the ones to cost with --context")
    samples = _samples(used, chosen, path, notes)
    spreads = {key: (max(v) - min(v)) / min(v) for key, v in samples.items() if key[0] != AR and len(v) > 1}
    tree_spreads = [value for (kind, _, _), value in spreads.items() if kind == TREE]
    if tree_spreads:
        notes.append(f"runs of one budget at one C (other topk, repeats) differ in step time by up to "
                     f"{100 * max(tree_spreads):.1f}%; their median is used")
    per_c: dict[int, float] = {}
    for (_, c, _), value in spreads.items():
        per_c[c] = max(per_c.get(c, 0.0), value)
    tree: dict[int, dict[int, float]] = {}
    for (kind, c, budget), v in samples.items():
        if kind == TREE:
            tree.setdefault(c, {})[budget] = median(v)
    if not tree:
        raise UserError(f"{path}: no DDTree run has a clean cell at every context {', '.join(map(str, chosen))} "
                        "at any concurrency")
    blocks = {b for b in (_info(run).get("speculative_dflash_block_size") for run in costing) if isinstance(b, int)}
    return Costs(
        source=path,
        contexts=chosen,
        tree=tree,
        chain={c: median(v) for (kind, c, _), v in samples.items() if kind == CHAIN},
        ar_tok_s={c: c / median(v) for (kind, c, _), v in samples.items() if kind == AR},
        models=frozenset(name for _, run, _ in used for name in _names(run)),
        block_sizes=frozenset(blocks),
        runs=tuple(RunUsed(run["run_id"], run["label"], kind, run.get("budget"), run.get("topk"))
                   for _, run, kind in used),
        notes=tuple(notes),
        spread=per_c,
    )

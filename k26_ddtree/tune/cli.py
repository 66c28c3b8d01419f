"""`k26-deploy tune`: the best DDTree config per concurrency and the batch-size schedule, from a
server trace (acceptance of every tree shape) and a `bench sweep` file (step times).

torch and matplotlib are imported inside the handler, so `k26-deploy --help` stays fast.
"""

from __future__ import annotations

import os
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from k26_ddtree.bench.cli import int_list, positive_int
from k26_ddtree.cli.checks import path_arg
from k26_ddtree.errors import UserError

if TYPE_CHECKING:
    from k26_ddtree.core.acceptance import TreeShape
    from k26_ddtree.sglang.common.trace import Records
    from k26_ddtree.tune.costs import Costs
    from k26_ddtree.tune.estimate import Acceptance, Replay
    from k26_ddtree.tune.report import Outcome

SPINES = {"on": (True,), "off": (False,), "both": (True, False)}
MAX_BUDGET = 64


def _same(a, b) -> bool:
    return os.path.normpath(str(a)) == os.path.normpath(str(b))


def _check_trace_matches(header: dict, trace: Path, model: str | None, costs: Costs) -> None:
    """One line for a trace of another model or DFlash block than the flag or the costs name."""
    traced = header.get("model")
    if model is not None and traced is None:
        raise UserError(f"{trace}: the trace header names no model, so --model {model} cannot be checked")
    if model is not None and not _same(traced, model):
        raise UserError(f"{trace} is a trace of model {traced}, not of --model {model}")
    if traced is not None and costs.models and not any(_same(traced, name) for name in costs.models):
        raise UserError(f"{trace} is a trace of model {traced}, but {costs.source} measured "
                        f"{', '.join(sorted(costs.models))}")
    block = int(header["depth"]) + 1
    if costs.block_sizes and block not in costs.block_sizes:
        raise UserError(f"{trace} was traced with DFlash block {block}, but {costs.source} measured block "
                        f"{', '.join(map(str, sorted(costs.block_sizes)))}")


def _open_trace(path: Path) -> Records:
    from k26_ddtree.sglang.common import trace

    try:
        return trace.open_records(path)
    except trace.TraceError as err:
        raise UserError(str(err)) from None


def _replay(records: Records) -> Replay:
    from k26_ddtree.sglang.common.trace import TraceError
    from k26_ddtree.tune.estimate import check_first_hits, replay

    try:
        rep = replay(records)
    except TraceError as err:
        raise UserError(str(err)) from None
    check_first_hits(rep, str(records.path))
    return rep


def _estimate(records: Records, rep: Replay, shapes: list[TreeShape], quiet: bool) -> Acceptance:
    from k26_ddtree.progress import Reporter, TotalMeter
    from k26_ddtree.sglang.common.trace import TraceError
    from k26_ddtree.tune.estimate import acceptance

    reporter = Reporter(sys.stderr, quiet=quiet)
    reporter.line(f"tune: replaying {rep.steps} steps under {len(shapes)} tree shapes")
    # The work per step is the same throughout (every shape, every step), so the rate so far
    # gives the time left.
    meter = TotalMeter("tune: acceptance", rep.steps, unit="steps")

    def on_steps(done: int) -> None:
        meter.set_done(done)
        reporter.tick(meter)

    try:
        found = acceptance(records, rep, shapes, on_steps)
    except TraceError as err:
        raise UserError(str(err)) from None
    reporter.finish(meter)
    return found


def _targets(args, out: Path, plot: Path) -> tuple[Path, Path]:
    """Where the schedule file and the plot go (paths' rules: never over the trace or the costs)."""
    from k26_ddtree.paths import distinct_outputs, output_target

    inputs = (args.trace, args.costs)
    targets = {"--out": output_target(out, "--out", inputs), "--plot": output_target(plot, "--plot", inputs)}
    distinct_outputs(targets)
    return targets["--out"], targets["--plot"]


def _write(out: Path, plot: Path, outcome: Outcome) -> None:
    from k26_ddtree.bench.results import write_json_atomic
    from k26_ddtree.tune.plot import write_plot
    from k26_ddtree.tune.report import chain_config, document

    write_json_atomic(out, document(outcome))
    try:
        write_plot(plot, outcome.chosen, outcome.others, chain_config(outcome), outcome.acceptance,
                   outcome.replay.depth, outcome.costs.ar_tok_s)
    except OSError as err:
        raise UserError(f"cannot write the plot {plot}: {err.strerror or err}") from None


def _budgets(args, costs: Costs, concurrencies: list[int]) -> range:
    """The budgets searched: the flags, or by default every budget the costs measured around at
    each planned C (tune never extrapolates a step time)."""
    spans = [costs.budgets(c) for c in concurrencies if costs.budgets(c)]
    lowest = args.min_budget if args.min_budget is not None else max([s[0] for s in spans], default=1)
    highest = args.max_budget if args.max_budget is not None else min([s[-1] for s in spans], default=MAX_BUDGET)
    highest = min(highest, MAX_BUDGET) if args.max_budget is None else highest
    if not 1 <= lowest <= highest <= MAX_BUDGET:
        given = "" if args.min_budget is not None and args.max_budget is not None else \
            f" (the costs measured budgets {lowest}-{highest} at every C planned for)"
        raise UserError(f"need 1 <= --min-budget <= --max-budget <= {MAX_BUDGET}, got {lowest} and {highest}{given}")
    return range(lowest, highest + 1)


def handle_tune(args) -> int:
    from k26_ddtree.tune.costs import load_costs
    from k26_ddtree.tune.estimate import as_served, searched_shapes
    from k26_ddtree.tune.leads import leads
    from k26_ddtree.tune.predict import choose, plan
    from k26_ddtree.tune.report import Outcome, notes, summary, table

    out = args.out or Path(f"k26-tune-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}.json")
    out, plot = _targets(args, out, args.plot or out.with_suffix(".png"))
    costs = load_costs(args.costs, args.context)
    records = _open_trace(args.trace)
    header, depth = records.header, records.depth
    _check_trace_matches(header, args.trace, args.model, costs)
    concurrencies = sorted(set(args.concurrency or costs.concurrencies()))
    budgets = _budgets(args, costs, concurrencies)
    shapes = searched_shapes(depth, SPINES[args.spine], budgets)
    if not shapes:
        raise UserError(f"no tree shape of draft depth {depth} has a budget in {budgets.start}-{budgets.stop - 1}")
    costs.require(concurrencies, budgets.start, budgets.stop - 1)
    rep = _replay(records)
    found = _estimate(records, rep, shapes, args.quiet)
    acceptance = as_served(found.means(), rep)
    plans = [plan(acceptance, depth, costs, concurrencies, spine, budgets) for spine in SPINES[args.spine]]
    chosen = choose(plans)
    outcome = Outcome(trace=args.trace, header=header, replay=rep, acceptance=acceptance, costs=costs,
                      chosen=chosen, others=[p for p in plans if p is not chosen], budgets=budgets,
                      spine_option=args.spine, leads=leads(found, chosen))
    print("".join(f"note: {line}\n" for line in notes(outcome)))
    print(f"Predicted (acceptance from the trace, step ms from the bench runs, * best at that C; spine "
          f"{'on' if chosen.spine else 'off'}):\n")
    print(table(outcome, args.top))
    print(summary(outcome), end="")
    _write(out, plot, outcome)
    print(f"tune: schedule file {out}, plot {plot}; serve it: sudo k26-deploy reconfigure --schedule-file {out}",
          file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "tune",
        help="best DDTree config per concurrency and the batch-size schedule, from a trace and bench step times",
        description=(
            "Replay a DDTree server trace (--speculative-ddtree-trace) under every tree shape (the budgets the costs measured, up to 64, "
            "topk 1..8, spine off/on) for its exact greedy acceptance per step, take step times per "
            "(concurrency, budget) from a `k26-deploy bench sweep` results file, and predict tok/s = C x "
            "acceptance / step time. Prints config x concurrency (acceptance, step ms, tok/s), the best "
            "config per C with the reconfigure command that serves it alone, and writes the schedule JSON "
            "that `k26-deploy reconfigure --schedule-file` serves, and a PNG. Predictions, not measurements."
        ),
    )
    p.add_argument("--trace", type=path_arg, required=True, help="trace file written by the server")
    p.add_argument("--costs", type=path_arg, required=True, metavar="SWEEP.json",
                   help="bench results file (bench sweep over budgets; DFLASH and AR runs too, if any)")
    p.add_argument("--concurrency", type=int_list, metavar="C,C,...",
                   help="concurrencies to plan for, the schedule's buckets (default: those the costs measured)")
    p.add_argument("--spine", choices=tuple(SPINES), default="both",
                   help="trees with the spine, without, or both and keep the better (one value for every "
                        "bucket; default both)")
    p.add_argument("--min-budget", type=positive_int, metavar="B",
                   help="smallest budget searched (default: the smallest the costs measured at every C planned for)")
    p.add_argument("--max-budget", type=positive_int, metavar="B",
                   help=f"largest budget searched, at most {MAX_BUDGET} (default: the largest the costs measured at "
                        "every C planned for); costs must cover the searched range")
    p.add_argument("--context", type=int_list, metavar="N,N,...",
                   help="bench contexts whose step times count, averaged (default: every context all runs measured)")
    p.add_argument("--model", metavar="PATH", help="the model the trace must be of (its header's model)")
    p.add_argument("--top", type=positive_int, default=3, metavar="N", help="configs per concurrency in the table (default 3)")
    p.add_argument("--out", type=path_arg, help="schedule JSON to write (default ./k26-tune-<UTC time>.json)")
    p.add_argument("--plot", type=path_arg, help="PNG to write (default: --out with .png)")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=handle_tune)

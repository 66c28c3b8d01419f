"""`k26-deploy tune` on the proving ground, the way an engineer runs it on a box, then its check.

A run's tune groups come from matrix.json "tunes" (one per drafter: the trace server, the cost
servers, tune's arguments). costs_and_tune (in the run that traced): each group's server trace
comes from the run's own greedy cells on its trace server (the matrix prompts, the run's tokens
per request), copied before any bench request reaches a server; step costs from `k26-deploy
bench run --steady` against each of its cost servers at the tune concurrencies, on the same
prompts and tokens per request: a closed loop over whole cycles of the prompts, as the speed
table serves them, so the step times are those of the steady state the table measures (bench's
default cells, a few waves each, had DFLASH's C=64 step at 88 ms against the table's 61). The
--cost-repeats repeats run as rounds across the group's cost servers, one closed loop per server
and concurrency each, and tune takes each cost's median over the rounds; then `k26-deploy tune`
writes tune.json (+ .png, and its printout in .txt). Every group's files are
packed with its costs and trace into OUT/tune.tar.xz (tune/GROUP/); WORK/tune-GROUP.json stays
for a later call on the warm machine, whose ddtree-s<NAME> server serves it (e2e --schedule
NAME=@FILE), and so does the trace that tune read (tuned_trace). In that later speed run a table
group (TableCosts) measures its costs inside the speed table, between its rounds, and tunes on
that kept trace: costs and table then share the call's minutes.

check (here, on the results): tune's predicted acceptance and tok/s of every config in a speed
table against what the table measured, and the schedule against the best single config and
DFLASH at every concurrency, and against the single server that serves the config the schedule
chose there (an A/A pair, the measurement's own spread). Several tables of the same servers
are pooled, each cell the mean of the tables' medians. Then tune's model once more, on step times
taken from the table itself (same_table): costs measured in another call also carry whatever the
machine did differently then, and this separates the model from that.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean, median

from k26_ddtree import atomic
from k26_ddtree.core.acceptance import TreeShape
from k26_ddtree.errors import UserError
from proving_ground import speed
from proving_ground.speed import ratio_interval
from proving_ground.matrix import parse_server, variant
from k26_ddtree.jsonread import Unreadable, read_json
from k26_ddtree.sglang.common.trace import FLUSH_SECONDS
from k26_ddtree.tune.costs import bracket, interpolate

TUNE_CONCURRENCY = (1, 4, 16, 64)
GREEDY = "greedy-c"  # the speed cells tune is checked on: greedy-cC, at concurrency C
# Every record of the last cell is in the file by then.
TRACE_SETTLE_S = FLUSH_SECONDS + 1.0
# How close tune's predicted tok/s must come to the table.
TOLERANCE = 0.10
# What one tune takes after a speed table (it replays the trace: about 10 s for 700 steps of 24 requests).
TABLE_TUNE_S = 20


def bench_run(url: str, results: Path, label: str, extra: list[str], log: Path, timeout: float) -> int | str:
    """`k26-deploy bench run` (the users' harness) against one server, appending to `results` and
    its output to `log`: the exit code, or "timeout"."""
    cmd = [sys.executable, "-m", "k26_ddtree", "bench", "run", "--url", url, "--out", str(results), "--label", label,
           *extra]
    with log.open("a") as fh:
        try:
            return subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return "timeout"


def write_prompt_set(path: Path, prompts: list[list[int]]) -> Path:
    """The run's prompts as a `bench run --prompt-set` file, in their order."""
    atomic.write_text(path, "".join(json.dumps({"input_ids": ids}) + "\n" for ids in prompts))
    return path


@dataclass(frozen=True)
class TuneGroup:
    """One `k26-deploy tune` of a run: its name (a drafter's, say), the server whose greedy cells it
    traces, the servers whose steady costs it reads, and tune's further arguments. A table group
    (trace_from, in a speed run) traces nothing: its costs are measured inside the speed table,
    between its rounds, and it tunes on the trace an earlier run's group `trace_from` tuned on."""

    name: str
    trace: str  # "" for a table group
    costs: tuple[str, ...]
    args: tuple[str, ...] = ()
    trace_from: str = ""

    def trace_file(self, work: Path) -> Path:
        return work / f"trace-{self.name}.k26"


def tuned_trace(work: Path, group: str) -> Path:
    """The trace group `group`'s tune read, kept in WORK for a later call's table group: its trace
    server goes on appending to the live file."""
    return work / f"tuned-trace-{group}.k26"


GROUP_NAME = re.compile(r"[a-z][a-z0-9-]*")


def _group_shape(group) -> bool:
    """A matrix "tunes" group: exactly one of a trace server (a name) and an earlier group to take
    the trace from, the cost servers, and tune's optional arguments."""
    if not isinstance(group, dict) or not _strings(group.get("costs")) or not _strings(group.get("args", [])):
        return False
    trace, source = group.get("trace"), group.get("trace_from")
    if source is None:
        return isinstance(trace, str) and bool(trace)
    return trace is None and isinstance(source, str) and bool(GROUP_NAME.fullmatch(source))


def _strings(value) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def groups(spec: dict, run: str, started: list[str]) -> tuple[list[TuneGroup], list[str]]:
    """matrix.json "tunes" of this run, checked against the run's servers (UserError, one line),
    and narrowed to the servers this run starts (--only, a chain-only tune file): a group whose
    trace server is not started is left out, a cost server that is not started is not benched;
    each said in a note."""
    in_run = spec["runs"][run]
    speed_run = run in spec.get("speed_runs", [])
    out, notes = [], []
    for name, group in spec.get("tunes", {}).get(run, {}).items():
        where = f"matrix \"tunes\" {run}/{name}"
        if not GROUP_NAME.fullmatch(name):
            raise UserError(f"{where}: a group name is a lowercase letter, then lowercase letters, digits or '-'")
        if not _group_shape(group):
            raise UserError(f"{where}: expected {{\"trace\": SERVER or \"trace_from\": GROUP, \"costs\": [SERVER, ...], "
                            "\"args\": [TUNE ARGUMENT, ...]} (args optional)")
        source = group.get("trace_from")
        if source is not None and not speed_run:
            raise UserError(f"{where}: \"trace_from\" (costs inside the speed table) needs a speed run")
        found = TuneGroup(name, group.get("trace") or "", tuple(group["costs"]), tuple(group.get("args", [])),
                          source or "")
        missing = [s for s in (*([found.trace] if found.trace else []), *found.costs) if s not in in_run]
        if missing:
            raise UserError(f"{where}: {missing[0]} is not a server of run {run}")
        if found.trace and not found.trace.startswith("ddtree-"):
            raise UserError(f"{where}: the trace server {found.trace} is no DDTree server")
        if found.trace and found.trace not in started:
            notes.append(f"tune {name}: left out, its trace server {found.trace} is not started in this run")
            continue
        dropped = [s for s in found.costs if s not in started]
        if dropped:
            notes.append(f"tune {name}: {', '.join(dropped)} not started in this run, so not costed")
            found = TuneGroup(name, found.trace, tuple(s for s in found.costs if s in started), found.args,
                              found.trace_from)
        out.append(found)
    traced = [g.trace for g in out if g.trace]
    if len(set(traced)) != len(traced):
        raise UserError(f"matrix \"tunes\" {run}: two groups trace one server")
    return out, notes


def with_kept_traces(tunes: list[TuneGroup], work: Path, now: float) -> tuple[list[TuneGroup], list[str]]:
    """The groups whose trace is at hand, and a note for each table group: left out when no earlier
    run of this machine kept its trace (before any cost loop is spent on it), else how old it is."""
    out, notes = [], []
    for group in tunes:
        if group.trace_from:
            kept = tuned_trace(work, group.trace_from)
            if not kept.is_file():
                notes.append(f"tune {group.name}: left out, no earlier run of this machine tuned group "
                             f"{group.trace_from} ({kept} is missing)")
                continue
            notes.append(f"tune {group.name}: tunes on the trace group {group.trace_from} tuned on "
                         f"{(now - kept.stat().st_mtime) / 60:.0f} min ago")
        out.append(group)
    return out, notes


def _bench_args(prompt_set: Path, new_tokens: int, cost_seconds: float, levels: str) -> list[str]:
    """`bench run` arguments of one cost measurement: the run's prompts and tokens per request in a
    closed loop at each of `levels`, one repeat (the repeats are rounds across the cost servers)."""
    return ["--concurrency", levels, "--prompt-set", str(prompt_set), "--output-len", str(new_tokens),
            "--steady", str(cost_seconds), "--repeats", "1", "--quiet"]


def _rotated(names: tuple[str, ...], turn: int) -> list[str]:
    """The cost servers in order from the `turn`th: each round (or C) starts at another server, so
    that no server always runs first, right after the table's repeats or the previous round."""
    if not names:
        return []
    turn %= len(names)
    return list(names[turn:] + names[:turn])


class TableCosts:
    """The costs of a speed run's table groups, measured inside the speed table: costs measured in
    another call carry whatever the machine did differently then, and in one call they share the
    table's minutes. After the middle round of each greedy cell at a tune concurrency C, one closed
    loop at C per cost server (the order rotated with C), into OUT/tune/GROUP/costs.json;
    costs_and_tune then tunes on them. The loops leave the cell's remaining rounds their time,
    and none starts with less than 20 s before that; each lasts --cost-seconds and whole prompt
    cycles, as a table repeat lasts min_seconds and whole cycles."""

    def __init__(self, servers, groups: list[TuneGroup], args, prompts: list[list[int]], new_tokens: int,
                 deadline: float, say):
        self.servers, self.groups, self.args, self.deadline, self.say = servers, groups, args, deadline, say
        self.prompt_set = write_prompt_set(args.work / "prompts.jsonl", prompts)
        self.new_tokens = new_tokens

    def after_round(self, cell_name: str, cell: dict, r: int, rounds: int, rest_s: float) -> None:
        c = int(cell["concurrency"])
        if r != rounds // 2 or float(cell["temperature"]) != 0.0 or c not in TUNE_CONCURRENCY:
            return
        bench = _bench_args(self.prompt_set, self.new_tokens, self.args.cost_seconds, str(c))
        for group in self.groups:
            out = self.args.out / "tune" / group.name
            out.mkdir(parents=True, exist_ok=True)
            bench_servers(self.servers, _rotated(group.costs, TUNE_CONCURRENCY.index(c)), out / "costs.json",
                          out / "tune.log", bench, self.deadline - rest_s, f"tune {group.name} costs in {cell_name}",
                          self.say)


def costs_and_tune(servers, tunes: list[TuneGroup], args, prompts: list[list[int]], new_tokens: int,
                   deadline: float, say) -> None:
    """Each group's trace copied, its costs measured (a table group's are, inside the table) and
    tune run; everything packed into OUT/tune.tar.xz."""
    root = args.out / "tune"
    levels = ",".join(map(str, TUNE_CONCURRENCY))
    try:
        # Every trace is copied before the first bench: a cost server may be another group's trace server.
        if any(group.trace and group.trace_file(args.work).is_file() for group in tunes):
            time.sleep(TRACE_SETTLE_S)
        for group in tunes:
            (root / group.name).mkdir(parents=True, exist_ok=True)
            source = tuned_trace(args.work, group.trace_from) if group.trace_from else group.trace_file(args.work)
            if source.is_file():
                shutil.copyfile(source, root / group.name / "trace.k26")
        bench = _bench_args(write_prompt_set(args.work / "prompts.jsonl", prompts), new_tokens, args.cost_seconds,
                            levels)
        for i, group in enumerate(tunes):
            out = root / group.name
            costs = out / "costs.json"
            for r in range(0 if group.trace_from else args.cost_repeats):
                # Round r benches every cost server once, the order rotated by r, as the speed table
                # interleaves its repeats: a drift of the machine then moves every server's costs
                # alike, where one server's repeats back to back all caught the same few seconds.
                # (Each round's loop starts at prompt 0, where back-to-back repeats started one
                # prompt on: a loop covers whole cycles of the prompts either way.)
                # This tune and every later group's need a minute each.
                bench_servers(servers, _rotated(group.costs, r), costs, out / "tune.log", bench,
                              deadline - 60 * (len(tunes) - i),
                              f"tune {group.name} costs, round {r + 1}/{args.cost_repeats}", say)
            # A table group plans for the C its loops measured: a cell the deadline cut has none.
            _tune(args, group, out, costs, None if group.trace_from else levels, deadline, say)
    finally:
        # One file back from the device (it brings back at most 8): costs, traces, tune's outputs.
        if root.is_dir():
            with tarfile.open(args.out / "tune.tar.xz", "w:xz") as archive:
                archive.add(root, arcname="tune")
            shutil.rmtree(root)


def bench_servers(servers, names: list[str], results: Path, log: Path, extra: list[str], deadline: float,
                  what: str, say) -> None:
    """`bench_run` against each named server that is ready, one at a time, while at least 20 s are
    left before `deadline`; each line says what the host's CPUs did meanwhile (speed.host_cpu)."""
    by_name = {s.spec.name: s for s in servers}
    for name in names:
        server = by_name.get(name)
        if server is None or server.status != "ready":
            say(f"{what}: {name} is not ready, skipped")
            continue
        left = deadline - time.time()
        if left < 20:
            say(f"{what}: no time left for {name}")
            break
        t, before = time.time(), speed.cpu_times()
        rc = bench_run(server.url, results, name, extra, log, left)
        cpu = speed.host_cpu(before, speed.cpu_times())
        host = f", host CPUs {100 * cpu.busy:.1f}% busy, {100 * cpu.steal:.2f}% stolen" if cpu else ""
        say(f"{what} {name}: exit {rc} ({time.time() - t:.0f} s{host})")


def _tune(args, group: TuneGroup, out: Path, costs: Path, levels: str | None, deadline: float, say) -> None:
    """`k26-deploy tune` on the group's trace and costs, at `levels` (None: every C the costs
    measured). On success its JSON, and for a tracing group the trace it read, stay in WORK."""
    trace = out / "trace.k26"
    if not trace.is_file() or not costs.is_file():
        # A table group's kept trace was checked at the start (with_kept_traces).
        say(f"tune {group.name}: no {'costs' if trace.is_file() else 'trace'}; not run")
        return
    cmd = [sys.executable, "-m", "k26_ddtree", "tune", "--trace", str(trace), "--costs", str(costs),
           *(["--concurrency", levels] if levels else []), "--model", str(args.models / "target"),
           "--out", str(out / "tune.json"), "--plot", str(out / "tune.png"), *group.args]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30.0, deadline - time.time()))
    except subprocess.TimeoutExpired:
        say(f"tune {group.name}: still running at the run's deadline; stopped")
        return
    (out / "tune.txt").write_text(proc.stdout + proc.stderr)
    say(f"tune {group.name}: exit {proc.returncode}\n" + "\n".join((proc.stdout + proc.stderr).splitlines()[-6:]))
    if proc.returncode == 0:
        shutil.copyfile(out / "tune.json", args.work / f"tune-{group.name}.json")
        if group.trace:
            shutil.copyfile(trace, tuned_trace(args.work, group.name))


def _served_config(name: str) -> str | None:
    """The tune config name (TreeShape.name, or DFLASH) a matrix server serves; None for AR and
    schedule servers, which serve no one config."""
    if name.startswith("ddtree-s"):
        return None
    spec = parse_server(name)
    if spec.algo == "AR":
        return None
    return "DFLASH" if spec.algo == "DFLASH" else TreeShape(spec.budget, spec.topk, spec.spine).name


def check(tune_path: Path, speed_paths: list[Path], schedule_server: str, served_path: Path | None = None) -> dict:
    """Predicted against measured for the speed tables' servers (greedy cells only). Several tables
    of the same servers (back-to-back calls) are pooled: each cell is the mean of its tables' medians.
    served_path: the tune file whose schedule the schedule server served, when another tune (on
    costs measured later, in the table's call) predicts it; by default the one of tune_path."""
    if len({Path(p).resolve() for p in speed_paths}) != len(speed_paths):
        raise UserError("the same speed table is given twice: pool only different tables of the same servers")
    try:
        tuned = read_json(tune_path)
        served = tuned if served_path is None else read_json(served_path)
        speed_docs = [read_json(path) for path in speed_paths]
    except (FileNotFoundError, Unreadable) as err:
        raise UserError(str(err)) from None
    predicted = {}
    for row in tuned["predictions"]:
        key = "DFLASH" if row["dflash_chain"] else row["config"]
        predicted[key] = row
    cells = _pooled(speed_docs)
    served_best = _served_best(served, predicted, served_path, set(cells.get(schedule_server, {})))
    # A server of the run that measured nothing (it did not start) is checked without verdicts; a
    # name no table knows is a mistake.
    known = set(cells) | {str(s.get("name")) for doc in speed_docs for s in doc.get("servers") or []
                          if isinstance(s, dict)}
    if schedule_server not in known:
        raise UserError(f"--schedule-server {schedule_server}: no server of the speed tables "
                        f"(servers: {', '.join(sorted(known)) or 'none'})")
    rows = []
    for server, by_c in sorted(cells.items()):
        config = _served_config(server)
        for c, cell in sorted(by_c.items()):
            row = {"server": server, "concurrency": c, "measured_tok_s": cell["median_tok_s"],
                   "measured_acceptance": cell.get("accept_length")}
            if len(cell["table_medians"]) > 1:
                row["table_medians"] = cell["table_medians"]
            pred = _prediction(served_best, predicted, config, server == schedule_server, c)
            if pred is not None:
                row.update(predicted_acceptance=pred[0], predicted_tok_s=pred[1])
                if row["measured_acceptance"]:
                    row["acceptance_error"] = pred[0] / row["measured_acceptance"] - 1
                row["tok_s_error"] = pred[1] / row["measured_tok_s"] - 1
            rows.append(row)
    result = {"tables": [str(p) for p in speed_paths], "rows": rows,
              "verdicts": _verdicts(cells, schedule_server, _chosen(served_best)),
              "same_table": same_table(served_best, predicted, cells, schedule_server),
              "costs_vs_table": costs_vs_table(tuned, cells, schedule_server)}
    if len(speed_docs) > 1:
        result["tables_agree"] = tables_agree(cells)
    if served_path is not None:
        result["served"] = {"path": str(served_path), "schedule": served.get("schedule")}
    return result


def _mapping(value, what: str) -> dict:
    """A tune file's object, {} where it has none; UserError for anything else."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UserError(f"--tune: {what} is not an object")
    return value


def tables_agree(cells: dict) -> dict | None:
    """How far the pooled tables' medians of each cell lie apart (largest over smallest, less 1):
    the same servers measured again, an A/A pair of the whole measurement: what one table's
    cells miss another's by."""
    gaps = sorted(max(cell["table_medians"]) / min(cell["table_medians"]) - 1
                  for by_c in cells.values() for cell in by_c.values() if len(cell["table_medians"]) > 1)
    if not gaps:
        return None
    return {"cells": len(gaps), "within": sum(g <= TOLERANCE for g in gaps), "median_gap": median(gaps),
            "largest_gap": gaps[-1]}


def _served_best(served: dict, predicted: dict, served_path: Path | None, measured: set[int]) -> dict[int, dict]:
    """{C: what the schedule server serves there, with tune's prediction}: the served tune file's
    pick at each C, predicted by --tune's model when that is another file (at each C the tables
    measured the schedule server: those must have a prediction)."""
    planned = served.get("per_concurrency") if isinstance(served, dict) else None
    if not isinstance(planned, list) or not all(isinstance(p, dict) and "concurrency" in p for p in planned):
        where = f"--served {served_path}" if served_path else "--tune"
        raise UserError(f"{where}: not a tune file (no per_concurrency list of planned concurrencies)")
    best = {int(p["concurrency"]): p.get("best") for p in planned}
    if served_path is None:
        return best
    out = {}
    for c, pick in best.items():
        if not isinstance(pick, dict):
            if c in measured:
                raise UserError(f"--served {served_path}: it chose no config at C={c}")
            continue
        key = "DFLASH" if pick.get("dflash_chain") else pick.get("config")
        row = predicted.get(key)
        if row is None or str(c) not in row["predicted"]:
            if c in measured:
                raise UserError(f"--served {served_path}: its config at C={c}, {key}, has no prediction in the "
                                "--tune file")
            continue
        out[c] = {**pick, "acceptance": row["acceptance"], "tok_s": row["predicted"][str(c)]["tok_s"]}
    return out


def costs_vs_table(tuned: dict, cells: dict, schedule_server: str) -> list[dict]:
    """tune's cost cells (its `measured` step times) against the table's cells of the servers that
    serve those configs, as rates: what the costs' bench loops and the table's repeats measured of
    the same servers. In one call this is the two clients' A/A pair; across calls it adds the machine's drift."""
    measured = _mapping(tuned.get("measured"), "measured")
    chain = _mapping(measured.get("dflash_step_ms"), "measured.dflash_step_ms")
    trees = _mapping(measured.get("ddtree_step_ms"), "measured.ddtree_step_ms")
    rows = []
    for server, by_c in sorted(cells.items()):
        config = _served_config(server)
        if config is None or variant(server) != variant(schedule_server):
            continue
        for c, cell in sorted(by_c.items()):
            if config == "DFLASH":
                cost_ms = chain.get(str(c))
            else:
                at_c = _mapping(trees.get(str(c)), f"measured.ddtree_step_ms.{c}")
                cost_ms = at_c.get(str(parse_server(server).budget))
            if cost_ms is not None and not isinstance(cost_ms, (int, float)):
                raise UserError(f"--tune: measured step time {cost_ms!r} of {server} at C={c} is not a number")
            table_s = _step_s(cell, c)
            if not cost_ms or table_s is None:
                continue
            table_ms = 1000 * table_s
            rows.append({"server": server, "concurrency": c, "cost_step_ms": cost_ms, "table_step_ms": table_ms,
                         "rate_error": table_ms / cost_ms - 1})
    return rows


def _step_s(cell: dict, c: int) -> float | None:
    """A pooled cell's seconds per batch step, as tune reads a cost cell (C * acceptance / tok/s);
    None for a cell that reports no acceptance (AR)."""
    return c * cell["accept_length"] / cell["median_tok_s"] if cell.get("accept_length") else None


def _table_steps(cells: dict, c: int, leave_out: str) -> tuple[dict[int, float], float | None]:
    """Step seconds at C of the table's single-config servers of `leave_out`'s drafter and
    setup, as tune reads a cost cell (C * acceptance / tok/s): ({budget: the median over its
    topks}, DFLASH's); `leave_out`'s own cell not used."""
    tree: dict[int, list[float]] = {}
    chain = None
    for server, by_c in cells.items():
        cell = by_c.get(c)
        step = _step_s(cell, c) if cell else None
        if server == leave_out or variant(server) != variant(leave_out) or _served_config(server) is None or not step:
            continue
        spec = parse_server(server)
        if spec.algo == "DFLASH":
            chain = step
        else:
            tree.setdefault(spec.budget, []).append(step)
    return {b: median(v) for b, v in tree.items()}, chain


def _predict_from(tree: dict[int, float], chain: float | None, c: int, budget: int | None,
                  acceptance: float) -> tuple[float, list[str]] | None:
    """(C * acceptance / step, the cells the step came from): the chain's step (budget None), or one
    interpolated between the table's budgets; None outside them, as tune never extrapolates."""
    if budget is None:
        return None if chain is None else (c * acceptance / chain, ["DFLASH"])
    try:
        used = bracket(tree, budget)
    except ValueError:
        return None
    return c * acceptance / interpolate(tree, budget), [f"b{b}" for b in used]


def same_table(best: dict[int, dict], predicted: dict, cells: dict, schedule_server: str) -> list[dict]:
    """tune's prediction with its costs taken from the speed table's own single-config cells, for
    what those cells do not already hold: the schedule server at each C (its configs, `best`,
    costed from the others' steps, its acceptance tune's), and each tree server whose budget lies
    between two others' (its own cell left out). Costs and measurement then share one machine state."""
    rows = []
    for server, by_c in sorted(cells.items()):
        for c, cell in sorted(by_c.items()):
            target = _same_table_target(server, best.get(c), schedule_server, predicted)
            if target is None:
                continue
            label, budget, acceptance = target
            got = _predict_from(*_table_steps(cells, c, leave_out=server), c, budget, acceptance)
            if got is not None:
                rows.append({"server": server, "concurrency": c, "config": label,
                             "measured_tok_s": cell["median_tok_s"], "predicted_tok_s": got[0],
                             "tok_s_error": got[0] / cell["median_tok_s"] - 1, "costed_from": got[1]})
    return rows


def _same_table_target(server: str, chosen, schedule_server: str,
                       predicted: dict) -> tuple[str, int | None, float] | None:
    """(config, budget or None for the chain, acceptance) that same_table predicts for a server at
    one C: the schedule's pick there, or the tree config a single server serves; None for nothing."""
    if server == schedule_server:
        if not isinstance(chosen, dict):
            return None
        if chosen.get("dflash_chain"):
            return "DFLASH", None, float(chosen["acceptance"])
        if "budget" not in chosen:
            return None
        return str(chosen.get("config")), int(chosen["budget"]), float(chosen["acceptance"])
    config = _served_config(server)
    if config in (None, "DFLASH") or config not in predicted:
        return None
    # Its own cell is left out of the steps: only a budget between two others' gets a prediction.
    return config, parse_server(server).budget, float(predicted[config]["acceptance"])


def _pooled(speed_docs: list[dict]) -> dict[str, dict[int, dict]]:
    """{server: {C: cell}} of the greedy cells, each the mean of its tables' medians and acceptances."""
    found: dict[str, dict[int, list[dict]]] = {}
    for doc in speed_docs:
        for cell in doc["speed"]:
            name = str(cell["cell"])
            rate = cell.get("median_tok_s")
            if rate is not None and not isinstance(rate, (int, float)):
                raise UserError(f"{cell.get('server')} {name}: median_tok_s {rate!r} is not a number")
            # A median of 0 is no rate to divide by (a cell whose every repeat failed): measured nothing.
            if name.startswith(GREEDY) and rate is not None and rate > 0:
                found.setdefault(cell["server"], {}).setdefault(int(name[len(GREEDY):]), []).append(cell)
    counts = {len(got) for by_c in found.values() for got in by_c.values()}
    if len(counts) > 1:
        short = sorted(f"{server} C={c}" for server, by_c in found.items() for c, got in by_c.items()
                       if len(got) < max(counts))
        raise UserError(f"the {len(speed_docs)} speed tables do not hold the same cells ({short[0]} is missing from "
                        "some): pool only tables of the same servers")
    pooled: dict[str, dict[int, dict]] = {}
    for server, by_c in found.items():
        for c, got in by_c.items():
            medians = [float(cell["median_tok_s"]) for cell in got]
            accepts = [float(cell["accept_length"]) for cell in got if cell.get("accept_length")]
            # Per-repeat rates: older committed tables have none, and a cell with failed
            # requests lists repeats its median left out.
            repeats = [[float(x) for x in cell.get("repeat_tok_s") or []] for cell in got]
            usable = all(repeats) and not any(cell.get("errors") for cell in got)
            pooled.setdefault(server, {})[c] = {"median_tok_s": fmean(medians), "table_medians": medians,
                                                "accept_length": fmean(accepts) if accepts else None,
                                                "table_repeats": repeats if usable else None}
    return pooled


def _chosen(best: dict[int, dict]) -> dict[int, str]:
    """The config (TreeShape.name, or DFLASH) the schedule serves at each concurrency tune planned."""
    chosen = {}
    for c, pick in best.items():
        name = isinstance(pick, dict) and ("DFLASH" if pick.get("dflash_chain") else pick.get("config"))
        if name:
            chosen[c] = name
    return chosen


def _prediction(best: dict[int, dict], predicted: dict, config: str | None, is_schedule: bool, c: int):
    if is_schedule:
        # A C the speed table measured but tune was not asked for has no prediction.
        pick = best.get(c)
        return None if pick is None else (pick["acceptance"], pick["tok_s"])
    row = predicted.get(config) if config else None
    if row is None or str(c) not in row["predicted"]:
        return None
    return row["acceptance"], row["predicted"][str(c)]["tok_s"]


def _verdicts(cells: dict, schedule_server: str, chosen: dict[int, str]) -> list[dict]:
    """Per C: the schedule's median against the best single config's and DFLASH's, and the single
    server that serves the very config the schedule chose at that C, if the table has one: their
    ratio measures nothing but the measurement's own spread (an A/A pair)."""
    out = []
    mine = cells.get(schedule_server, {})
    for c, cell in sorted(mine.items()):
        singles = {s: by_c[c]["median_tok_s"] for s, by_c in cells.items()
                   if s != schedule_server and s != "ar" and c in by_c}
        best = max(singles, key=singles.get) if singles else None
        # Where tune chose the plain chain at every C, DFLASH is the schedule's server (e2e drops the
        # ddtree-s server a chain-only schedule would need).
        dflash_cell = cell if schedule_server.startswith("dflash") else next(
            (cells[s][c] for s in singles if s.startswith("dflash")), None)
        twin = next((s for s in sorted(singles) if chosen.get(c) and _served_config(s) == chosen[c]
                     and variant(s) == variant(schedule_server)), None)
        vs_best, vs_best_interval = _against(cell, cells[best][c] if best else None)
        vs_dflash, vs_dflash_interval = _against(cell, dflash_cell)
        vs_twin, vs_twin_interval = _against(cell, cells[twin][c] if twin else None)
        out.append({"concurrency": c, "schedule_tok_s": cell["median_tok_s"], "best_single": best,
                    "best_single_tok_s": singles.get(best),
                    "dflash_tok_s": dflash_cell["median_tok_s"] if dflash_cell else None,
                    "vs_best": vs_best, "vs_dflash": vs_dflash, "same_config": twin, "vs_same_config": vs_twin,
                    "vs_best_interval": vs_best_interval, "vs_dflash_interval": vs_dflash_interval,
                    "vs_same_config_interval": vs_twin_interval})
    return out


def _against(cell: dict, other: dict | None) -> tuple[float | None, list[float] | None]:
    """(the schedule's median over another pooled cell's, its interval); a chain-only schedule
    is the DFLASH server itself: exactly 1, with no interval."""
    if other is None:
        return None, None
    if other is cell:
        return 1.0, None
    return cell["median_tok_s"] / other["median_tok_s"], ratio_interval(cell, other)


def markdown(result: dict) -> str:
    lines = ["| server | C | measured tok/s | predicted tok/s | error | measured accept | predicted accept | error |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        def pct(key):
            return f"{100 * r[key]:+.1f}%" if r.get(key) is not None else "-"

        def num(key, fmt):
            return format(r[key], fmt) if r.get(key) is not None else "-"

        measured = num("measured_tok_s", ".0f")
        if r.get("table_medians"):
            measured += " (" + " / ".join(f"{m:.0f}" for m in r["table_medians"]) + ")"
        lines.append(f"| {r['server']} | {r['concurrency']} | {measured} | "
                     f"{num('predicted_tok_s', '.0f')} | {pct('tok_s_error')} | {num('measured_acceptance', '.2f')} | "
                     f"{num('predicted_acceptance', '.2f')} | {pct('acceptance_error')} |")
    errors = [r["tok_s_error"] for r in result["rows"] if r.get("tok_s_error") is not None]
    if errors:
        lines += ["", f"tok/s within 10 %: {sum(abs(e) <= TOLERANCE for e in errors)} of {len(errors)} predictions "
                  f"(median error {100 * median(errors):+.1f}%)."]
    lines += ["", "| C | schedule tok/s | best single | its tok/s | ×best | ×DFLASH |", "|---|---|---|---|---|---|"]

    def ratio(v: dict, key: str) -> str:
        if v.get(key) is None:
            return "-"
        interval = v.get(key + "_interval")
        return f"{v[key]:.2f}" + (f" ({interval[0]:.2f}-{interval[1]:.2f})" if interval else "")

    for v in result["verdicts"]:
        # No single config measured at this C (a table of AR and the schedule only): "-".
        single = "-" if v["best_single_tok_s"] is None else f"{v['best_single_tok_s']:.0f}"
        lines.append(f"| {v['concurrency']} | {v['schedule_tok_s']:.0f} | {v['best_single'] or '-'} | "
                     f"{single} | {ratio(v, 'vs_best')} | {ratio(v, 'vs_dflash')} |")
    twins = [v for v in result["verdicts"] if v.get("same_config")]
    if twins:
        lines += ["", "Where the schedule serves the same config as a single server (an A/A pair: the ratio is the "
                  "measurement's own spread):", "", "| C | server | schedule / server |", "|---|---|---|"]
        lines += [f"| {v['concurrency']} | {v['same_config']} | {ratio(v, 'vs_same_config')} |" for v in twins]
    if any(v.get(key) for v in result["verdicts"]
           for key in ("vs_best_interval", "vs_dflash_interval", "vs_same_config_interval")):
        lines += ["", "A ratio's brackets: its 95 % bootstrap interval over the table's rounds; one that holds 1.00 "
                  "is a difference the table cannot tell from its own spread."]
    if len(result.get("tables", [])) > 1:
        lines += ["", f"Each measured cell: the mean of {len(result['tables'])} tables' medians (in brackets)."]
        agree = result.get("tables_agree")
        if agree:
            lines += [f"The tables against each other (the same servers, measured again): their medians are within "
                      f"10 % of each other in {agree['within']} of {agree['cells']} cells (median gap "
                      f"{100 * agree['median_gap']:.1f}%, largest {100 * agree['largest_gap']:.1f}%): how far one "
                      "table reproduces another."]
    if result.get("same_table"):
        lines += ["", "tune's model on step times from this table (each single-config cell's C x acceptance / tok/s, "
                  "budgets between them interpolated; a server's own cell left out):", "",
                  "| server | C | config | costed from | measured tok/s | predicted tok/s | error |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['server']} | {r['concurrency']} | {r['config']} | "
                  f"{', '.join(r['costed_from'])} | {r['measured_tok_s']:.0f} | "
                  f"{r['predicted_tok_s']:.0f} | {100 * r['tok_s_error']:+.1f}% |" for r in result["same_table"]]
    if result.get("served"):
        lines += ["", f"The schedule server served {result['served']['schedule']}, another tune's choice; the "
                  "predictions above are this tune's for those configs."]
    if result.get("costs_vs_table"):
        lines += ["", "tune's cost cells against the table's cells of the same servers (step time, C x acceptance "
                  "/ tok/s; the error as a rate):", "",
                  "| server | C | cost step ms | table step ms | cost rate vs table |", "|---|---|---|---|---|"]
        lines += [f"| {r['server']} | {r['concurrency']} | {r['cost_step_ms']:.2f} | {r['table_step_ms']:.2f} | "
                  f"{100 * r['rate_error']:+.1f}% |" for r in result["costs_vs_table"]]
        errors = [r["rate_error"] for r in result["costs_vs_table"]]
        lines += ["", f"Median {100 * median(errors):+.1f}% over {len(errors)} cells "
                  f"({sum(e < 0 for e in errors)} under the table)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m proving_ground.tuning",
                                     description="tune's predictions against a speed table's measurements")
    parser.add_argument("--tune", type=Path, required=True, help="tune.json of the tuning run")
    parser.add_argument("--speed", type=Path, required=True, action="append",
                        help="e2e-runRUN.json of the speed run (repeatable: tables of the same servers are pooled)")
    parser.add_argument("--schedule-server", required=True, help="the speed table's server serving tune's schedule")
    parser.add_argument("--served", type=Path, metavar="TUNE.json",
                        help="the tune file the schedule server served, when --tune is another tune (costs measured "
                        "in the table's call) that predicts it")
    parser.add_argument("--out", type=Path, help="write the result JSON here (and .md beside it)")
    args = parser.parse_args(argv)
    try:
        result = check(args.tune, args.speed, args.schedule_server, args.served)
        # In the try too: a value of the wrong type (a string tok/s) only fails where it is formatted.
        text = markdown(result)
        if args.out:
            atomic.write_text(args.out, json.dumps(result, indent=1) + "\n")
            atomic.write_text(args.out.with_suffix(".md"), text)
    except (UserError, KeyError, TypeError, ValueError) as err:
        print(f"tuning: error: {err}", file=sys.stderr)
        return 2
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Side-by-side speed on the proving ground: repeats long enough to resolve a few percent.

A speed table compares servers that all run on one GPU during one run.
Per cell (concurrency, temperature) every server first runs one warm-up pass
(untimed). A repeat keeps `concurrency` requests in flight (a closed loop: a
finished request's slot takes the next at once) and stops issuing new ones at
the first end of a whole cycle of the prompts after `min_seconds`: every repeat
is long enough by construction, and every server's repeat covers each prompt
equally often, so prompts of different difficulty weigh the same for all. The
only tail is the last requests in flight, once per repeat. Repeats of one cell
are interleaved across servers (round r runs every server once, the order
rotated by r; a round the deadline leaves no time for is not started), so a
drift of the machine during the cell shifts every server alike and the ratios
stay fair. Each cell reports the median, min and max tok/s over its repeats
and its acceptance; every greedy output is also checked against the AR
reference (lossless).

Only one workload is on the GPU at a time: the runner calls measure() once
everything else is done.
"""

from __future__ import annotations

import http.client
import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol

from k26_ddtree.bench.closed_loop import ClosedLoop
from proving_ground import lossless


@dataclass(frozen=True)
class SpeedSpec:
    """What one speed run measures (proving_ground/device/matrix.json "speed")."""

    cells: dict  # name -> {"concurrency": C, "temperature": T[, "top_p": P]}
    repeats: int
    min_seconds: float
    new_tokens: int
    eps: float

    @classmethod
    def from_matrix(cls, spec: dict, run: str | None = None) -> SpeedSpec:
        """The matrix's speed cells, or those "run_cells" names for this run; "run_repeats" gives a run
        more repeats than the default (a run of one cell, say)."""
        speed = spec["speed"]
        names = speed.get("run_cells", {}).get(str(run))
        cells = speed["cells"] if names is None else {n: speed["cells"][n] for n in names}
        repeats = speed.get("run_repeats", {}).get(str(run), speed["repeats"])
        return cls(cells, int(repeats), float(speed["min_seconds"]), int(spec["new_tokens"]), float(spec["eps"]))


@dataclass(frozen=True)
class HostCpu:
    """The machine's CPU time over one repeat, as shares of all its CPUs' time: busy (user,
    system, interrupts) and steal (time the hypervisor ran something else on our CPUs), to tell
    a repeat the host slowed from one the server did."""

    busy: float
    steal: float


def cpu_times() -> tuple[int, ...] | None:
    """/proc/stat's aggregate line (user nice system idle iowait irq softirq steal), or None off Linux."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    return tuple(int(f) for f in fields[1:9])


def host_cpu(before: tuple[int, ...] | None, after: tuple[int, ...] | None) -> HostCpu | None:
    if before is None or after is None:
        return None
    # proc(5): iowait can go backwards; a negative share would be noise read as a signal.
    user, nice, system, idle, iowait, irq, softirq, steal = (max(0, b - a) for a, b in zip(before, after))
    total = user + nice + system + idle + iowait + irq + softirq + steal
    if total <= 0:
        return None
    return HostCpu(round((user + nice + system + irq + softirq) / total, 3), round(steal / total, 3))


@dataclass
class Repeat:
    tokens: int
    wall_s: float
    requests: int
    verify_steps: int
    errors: int
    started_epoch: float  # lines a repeat up with the card's clock log (run.sh K26_GPU_STATE)
    host_cpu: HostCpu | None = None

    @property
    def tok_per_s(self) -> float:
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class CellResult:
    server: str
    cell: str
    repeats: list[Repeat] = field(default_factory=list)
    divergences: list[lossless.Divergence] = field(default_factory=list)
    checked: bool = False  # greedy outputs compared with the AR reference
    note: str = ""

    def summary(self, speculative: bool) -> dict:
        rates = [r.tok_per_s for r in self.repeats if not r.errors]
        tokens = sum(r.tokens for r in self.repeats)
        steps = sum(r.verify_steps for r in self.repeats)
        errors = sum(r.errors for r in self.repeats)
        return {
            "server": self.server, "cell": self.cell, "repeats": len(self.repeats),
            "median_tok_s": round(statistics.median(rates), 1) if rates else None,
            "min_tok_s": round(min(rates), 1) if rates else None,
            "max_tok_s": round(max(rates), 1) if rates else None,
            "repeat_seconds": [round(r.wall_s, 2) for r in self.repeats],
            "repeat_tok_s": [round(r.tok_per_s, 1) for r in self.repeats],
            "repeat_started": [round(r.started_epoch, 1) for r in self.repeats],
            "repeat_cpu_busy": [r.host_cpu.busy if r.host_cpu else None for r in self.repeats],
            "repeat_cpu_steal": [r.host_cpu.steal if r.host_cpu else None for r in self.repeats],
            "requests_per_repeat": self.repeats[-1].requests if self.repeats else 0,
            "accept_length": round(tokens / steps, 3) if speculative and steps else None,
            "errors": errors,
            "verdict": ("FAIL" if errors else lossless.verdict(self.divergences)) if self.checked else ("FAIL" if errors else "completed"),
            "divergences": [d.as_dict() for d in self.divergences[:20]],
            "note": self.note,
        }


Send = Callable[[str, list[int], dict], dict]


class Measured(Protocol):
    """What measure() needs of a server (e2e.Server is one)."""

    spec: object  # .name, .speculative
    url: str


def sampling_params(cell: dict, new_tokens: int) -> dict:
    """A workload cell's (temperature[, top_p]) as /generate's sampling_params, EOS ignored."""
    params = {"max_new_tokens": new_tokens, "ignore_eos": True, "temperature": float(cell["temperature"])}
    if "top_p" in cell:
        params["top_p"] = float(cell["top_p"])
    return params


def run_repeat(send: Send, url: str, prompts: list[list[int]], params: dict, concurrency: int,
               min_seconds: float, first: int = 0):
    """`concurrency` requests in flight, prompts cycled from `first`, until a whole number of
    prompt cycles (at least one, and at least `concurrency` requests) has been issued after
    min_seconds: (Repeat, [(prompt index, reply)])."""
    lock = threading.Lock()
    started = time.time()
    cpu_before = cpu_times()
    start = time.perf_counter()
    loop = ClosedLoop(len(prompts), concurrency, min_seconds, start, first)

    def next_prompt() -> int | None:
        with lock:
            return loop.take(time.perf_counter())

    def worker() -> list:
        mine = []
        while (index := next_prompt()) is not None:
            try:
                mine.append((index, send(url, prompts[index], params)))
            except (OSError, ValueError, http.client.HTTPException) as err:
                mine.append((index, {"error": f"{type(err).__name__}: {err}"}))
        return mine

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        replies = [r for part in pool.map(lambda _: worker(), range(concurrency)) for r in part]
    wall = time.perf_counter() - start
    cpu = host_cpu(cpu_before, cpu_times())
    ok = [r for _, r in replies if "error" not in r]
    tokens = sum(len(r.get("output_ids") or []) for r in ok)
    steps = sum(int((r.get("meta_info") or {}).get("spec_verify_ct") or 0) for r in ok)
    return Repeat(tokens, wall, len(replies), steps, len(replies) - len(ok), started, cpu), replies


AfterRound = Callable[[str, dict, int, int, float], None]


def measure(servers: list[Measured], spec: SpeedSpec, prompts: list[list[int]], reference: dict | None, send: Send,
            deadline: float, say: Callable[[str], None], after_round: AfterRound | None = None) -> list[dict]:
    """The summaries (CellResult.summary) of every cell of `spec` on every server (objects with
    .spec.name, .spec.speculative, .url), interleaved; rounds the deadline leaves no time
    for are not started, and the cell says so. after_round(cell name, cell, round, rounds,
    seconds the cell's remaining rounds need), if given, runs after each round (the costs
    measured inside the table: tuning.TableCosts)."""
    results = []
    speculative = {s.spec.name: s.spec.speculative for s in servers}
    for cell_name, cell in spec.cells.items():
        concurrency = int(cell["concurrency"])
        params = sampling_params(cell, spec.new_tokens)
        greedy = float(cell["temperature"]) == 0.0
        by_server = {s.spec.name: CellResult(s.spec.name, cell_name, checked=greedy and reference is not None)
                     for s in servers}
        longest = 0.0
        for server in servers:
            if time.time() > deadline:
                break
            warm, _ = run_repeat(send, server.url, prompts, params, concurrency, 0.0)
            longest = max(longest, warm.wall_s)
        for r in range(spec.repeats):
            # A repeat lasts min_seconds plus at most one pass; a round is one repeat per server.
            if time.time() + len(servers) * (spec.min_seconds + longest) > deadline:
                for result in by_server.values():
                    result.note = f"cut at the run deadline after {len(result.repeats)} repeats"
                break
            for server in servers[r % len(servers):] + servers[: r % len(servers)]:
                result = by_server[server.spec.name]
                repeat, replies = run_repeat(send, server.url, prompts, params, concurrency, spec.min_seconds,
                                             first=r)
                result.repeats.append(repeat)
                if result.checked:
                    result.divergences += lossless.divergences(
                        ((index, reply.get("output_ids") or []) for index, reply in replies if "error" not in reply),
                        reference, spec.eps)
            if after_round is not None:
                after_round(cell_name, cell, r, spec.repeats,
                            (spec.repeats - r - 1) * len(servers) * (spec.min_seconds + longest))
        for result in by_server.values():
            s = result.summary(speculative[result.server])
            say(f"speed {cell_name} {result.server}: median {s['median_tok_s']} tok/s "
                f"({s['min_tok_s']}-{s['max_tok_s']}, {s['repeats']} repeats of {s['requests_per_repeat']} requests) "
                f"accept {s['accept_length']} {s['verdict']}")
            results.append(s)
    return results


def ratio_table(summaries: list[dict], baseline: str) -> dict:
    """{cell: {server: median / baseline median}} for the side-by-side ratios."""
    by_cell: dict[str, dict[str, float]] = {}
    for s in summaries:
        by_cell.setdefault(s["cell"], {})[s["server"]] = s["median_tok_s"]
    ratios = {}
    for cell, medians in by_cell.items():
        base = medians.get(baseline)
        ratios[cell] = {name: (round(m / base, 3) if base and m else None) for name, m in medians.items()}
    return ratios


def markdown(run: str, summaries: list[dict], baseline: str, spec: SpeedSpec, device: str, prompts: int) -> str:
    ratios = ratio_table(summaries, baseline)
    cells = list(spec.cells)
    servers = list(dict.fromkeys(s["server"] for s in summaries))
    by = {(s["server"], s["cell"]): s for s in summaries}
    lines = [f"# Speed, run {run}", "",
             f"{device}; {spec.new_tokens} new tokens per request (ignore_eos), {prompts} prompts cycled; each cell the median "
             f"of {spec.repeats} repeats of >= {spec.min_seconds} s, interleaved across servers inside one server "
             f"start; ratios are medians over {baseline}'s median.", "",
             "| server | " + " | ".join(f"{c} tok/s (min-max) | x{baseline} | accept" for c in cells) + " | lossless |",
             "|---|" + "---|---|---|" * len(cells) + "---|"]
    for name in servers:
        row = [name]
        verdicts = set()
        for cell in cells:
            s = by.get((name, cell))
            if s is None or s["median_tok_s"] is None:
                row += ["-", "-", "-"]
                continue
            row.append(f"{s['median_tok_s']:.0f} ({s['min_tok_s']:.0f}-{s['max_tok_s']:.0f})")
            r = ratios[cell].get(name)
            row.append("" if r is None else f"{r:.2f}")
            row.append("" if s["accept_length"] is None else f"{s['accept_length']:.2f}")
            verdicts.add(s["verdict"])
        row.append(", ".join(sorted(verdicts)))
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    return "\n".join(lines)

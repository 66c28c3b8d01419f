"""Side-by-side speed on the proving ground: repeats long enough to resolve a few percent.

A speed table compares servers that all run on one GPU during one run.
Per cell (concurrency, temperature) every server first makes one streamed pass
(untimed for the table; its TTFT and ITL are the cell's latencies). The fastest
server's rate in that pass sets a repeat's set: whole waves of `concurrency`
prompts, enough that even the fastest server's repeat lasts `min_seconds`.
Round r gives every server the same set, so prompts of different difficulty
weigh the same for all servers. A repeat serves its set with `concurrency`
requests in flight (a closed loop: a finished request's slot takes the next
at once); once the set is sent, free slots take fillers, the prompts after
it, until the set's last reply, and the fillers still running are then
aborted. Its rate is every token made, an aborted filler's so far, over the
time from its first request to its last reply: every slot busy until the
set's last reply, all but that one until the aborts take effect a step or two
later. A speculative request's steps depend on its prompt, so a repeat that
let its batch thin out while its slowest requests finished would be rated
below the serving rate at that concurrency, which AR's equal-length requests
never are. Rounds run every server once, the order rotated by r; a round the
deadline leaves no time for is not started, so a drift of the machine during
the cell shifts every server alike and the ratios stay fair. Each cell reports
the median, min and max tok/s over its repeats and its acceptance; every
greedy output, an aborted filler's up to where it stopped, is also checked
against the AR reference (lossless).

Only one workload is on the GPU at a time: the runner calls measure() once
everything else is done.
"""

from __future__ import annotations

import asyncio
import http.client
import math
import random
import statistics
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Callable, Protocol

from k26_ddtree.bench.client import ServerClient
from k26_ddtree.bench.metrics import distribution_ms
from proving_ground import lossless


@dataclass(frozen=True)
class SpeedSpec:
    """What one speed run measures (proving_ground/device/matrix.json "speed")."""

    cells: dict  # name -> {"concurrency": C, "temperature": T[, "top_p": P]}
    repeats: int
    min_seconds: float
    new_tokens: int

    @classmethod
    def from_matrix(cls, spec: dict, run: str | None = None) -> SpeedSpec:
        """The matrix's speed cells, or those "run_cells" names for this run; "run_repeats" gives a run
        more repeats than the default (a run of one cell, say)."""
        speed = spec["speed"]
        names = speed.get("run_cells", {}).get(str(run))
        cells = speed["cells"] if names is None else {n: speed["cells"][n] for n in names}
        repeats = speed.get("run_repeats", {}).get(str(run), speed["repeats"])
        return cls(cells, int(repeats), float(speed["min_seconds"]), int(spec["new_tokens"]))


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
    wall_s: float  # from the first request to the last reply
    requests: int
    cut: int  # requests the repeat's end aborted
    verify_steps: int
    errors: int
    started_epoch: float  # lines a repeat up with the card's clock log (run.sh K26_GPU_STATE)
    host_cpu: HostCpu | None = None
    late: int = 0  # requests still running DRAIN_LIMIT_S after the abort: the rate is left out

    @property
    def tok_per_s(self) -> float:
        """The rate with all `concurrency` slots busy: the serving rate at that concurrency."""
        return self.tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass
class CellResult:
    server: str
    cell: str
    repeats: list[Repeat] = field(default_factory=list)
    divergences: list[lossless.Divergence] = field(default_factory=list)
    checked: bool = False  # greedy outputs compared with the AR reference
    note: str = ""
    latency: dict | None = None  # latency_pass() of the cell's warm pass
    regrown: list[str] = field(default_factory=list)  # "before->after" set sizes of each round not kept

    def summary(self, speculative: bool) -> dict:
        rates = [r.tok_per_s for r in self.repeats if not r.errors and not r.late]
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
            "repeat_requests": [r.requests for r in self.repeats],
            "repeat_cut": [r.cut for r in self.repeats],
            "repeat_late": [r.late for r in self.repeats],
            "repeat_started": [round(r.started_epoch, 1) for r in self.repeats],
            "repeat_cpu_busy": [r.host_cpu.busy if r.host_cpu else None for r in self.repeats],
            "repeat_cpu_steal": [r.host_cpu.steal if r.host_cpu else None for r in self.repeats],
            "accept_length": round(tokens / steps, 3) if speculative and steps else None,
            "errors": errors,
            "verdict": ("FAIL" if errors else lossless.verdict(self.divergences)) if self.checked else ("FAIL" if errors else "completed"),
            # every divergence that fails the cell, and the first ties
            "divergences": [d.as_dict() for d in self.divergences if not d.tie]
            + [d.as_dict() for d in self.divergences if d.tie][:20],
            "divergence_count": len(self.divergences),
            "stopped_early": lossless.stops(self.divergences),
            "latency": self.latency,
            "rounds_not_kept": [f"shorter than min_seconds; set {grown}" for grown in self.regrown],
            "note": self.note,
        }


BOOTSTRAP_DRAWS = 4000
MIN_BOOTSTRAP_REPEATS = 3


def ratio_interval(top: dict, bottom: dict) -> list[float] | None:
    """The 95 % percentile-bootstrap interval of the ratio of two pooled cells of the same tables.
    A speed table runs its repeats in rounds, every server once per round, so rounds are drawn
    again with replacement, the same rounds for both cells (a drift that moves a whole round
    moves both alike), and each draw is pooled as the cell is: the mean of the tables' medians.
    An interval that holds 1 is a difference the table cannot tell from its spread inside these
    server starts. None where a cell kept no usable per-repeat rates, or a table's two cells ran
    different numbers of rounds or fewer than 3. Seeded: the same tables give the same interval."""
    tops, bottoms = top.get("table_repeats"), bottom.get("table_repeats")
    if not tops or not bottoms or len(tops) != len(bottoms):
        return None
    for a, b in zip(tops, bottoms):
        if len(a) != len(b) or len(a) < MIN_BOOTSTRAP_REPEATS or min(a + b) <= 0:
            return None
    rng = random.Random(0)
    ratios = []
    for _ in range(BOOTSTRAP_DRAWS):
        rounds = [rng.choices(range(len(a)), k=len(a)) for a in tops]
        ratios.append(statistics.fmean(statistics.median(a[i] for i in r) for a, r in zip(tops, rounds))
                      / statistics.fmean(statistics.median(b[i] for i in r) for b, r in zip(bottoms, rounds)))
    ratios.sort()
    return [ratios[int(0.025 * BOOTSTRAP_DRAWS)], ratios[int(0.975 * BOOTSTRAP_DRAWS) - 1]]



Send = Callable[[str, list[int], dict, str], dict]  # (server url, input ids, sampling params, rid) -> reply
Abort = Callable[[str, str], None]  # (server url, rid): asks the server to end that request


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


def repeat_order(n_prompts: int, count: int, first: int) -> list[int]:
    """`count` prompts in order from `first`, cycling."""
    return [(first + i) % n_prompts for i in range(count)]


# The fastest server's repeat is planned this much longer than min_seconds: its warm pass, which
# sets the plan, streams and so runs slightly slower than the timed repeats.
PLAN_MARGIN = 1.1


def repeat_count(concurrency: int, fastest_tok_s: float, new_tokens: int, min_seconds: float) -> int:
    """A repeat's set: whole waves of `concurrency` requests, enough that the fastest server
    takes min_seconds over them."""
    waves = math.ceil(min_seconds * PLAN_MARGIN * max(fastest_tok_s, 1e-9) / (new_tokens * concurrency))
    return concurrency * max(1, waves)


def regrown_count(count: int, concurrency: int, min_seconds: float, shortest_s: float) -> int:
    """The set after a round whose shortest repeat took shortest_s: its waves grown in proportion."""
    waves = math.ceil(count // concurrency * min_seconds * PLAN_MARGIN / max(shortest_s, 1e-9))
    return concurrency * max(1, waves)


# While a repeat's fillers are aborted, the aborts of those still running are sent again this
# often: an abort that reaches the server before its request is dropped there.
ABORT_AGAIN_S = 0.25
# An aborted request ends within a step or two; one still running this long after the set's last
# reply is counted late (its thin tail is in the repeat's time, so its rate is left out).
DRAIN_LIMIT_S = 10.0


def run_repeat(send: Send, abort: Abort, url: str, prompts: list[list[int]], params: dict, concurrency: int,
               order: list[int]) -> tuple[Repeat, list[tuple[int, dict]]]:
    """The set `order` served with `concurrency` requests in flight (a closed loop: a finished
    request's slot takes the next at once). Once the set is sent, free slots take fillers, the
    prompts after it, until the set's last reply; then the fillers still running are aborted.
    So every slot is busy until the set is done, and every server serves the same set. The
    aborts go out at once, and again while fillers still run (an abort that reaches the server
    before its request is dropped there); an interrupted repeat aborts what it left running.
    (Repeat, [(prompt index, reply)]): the set's replies and the fillers', an aborted one
    holding the tokens made before its abort."""
    if len(order) < concurrency:
        raise ValueError(f"a set of {len(order)} requests cannot keep {concurrency} slots busy")
    tag = f"k26-speed-{uuid.uuid4().hex[:12]}"
    lock = threading.Lock()
    set_done = threading.Event()
    in_flight: set[str] = set()
    finished: list[tuple[int, dict, float]] = []
    state = {"issued": 0, "stopping": False, "set_left": len(order)}
    started = time.time()
    cpu_before = cpu_times()
    start = time.perf_counter()

    def slot() -> None:
        while True:
            with lock:
                if state["stopping"]:
                    return
                number = state["issued"]
                state["issued"] += 1
                rid = f"{tag}-{number:06d}"  # SGLang aborts every rid that starts with the one named
                in_flight.add(rid)
            index = order[number] if number < len(order) else (order[-1] + 1 + number - len(order)) % len(prompts)
            reply = None
            try:
                reply = send(url, prompts[index], params, rid)
            except (OSError, ValueError, http.client.HTTPException) as err:
                reply = {"error": f"{type(err).__name__}: {err}"}
            finally:
                with lock:
                    in_flight.discard(rid)
                    if reply is not None:
                        finished.append((index, reply, time.perf_counter() - start))
                    if number < len(order):
                        state["set_left"] -= 1
                    # a send that failed otherwise ends the repeat: its failure is raised below
                    if state["set_left"] == 0 or reply is None:
                        state["stopping"] = True
                        set_done.set()

    def abort_running() -> None:
        with lock:
            running = sorted(in_flight)

        def one(rid: str) -> None:
            try:
                abort(url, rid)
            except (OSError, ValueError, http.client.HTTPException):
                pass  # a filler that never ends is counted late

        # at once, not one by one: the batch thins while they go out
        with ThreadPoolExecutor(max_workers=max(1, min(16, len(running)))) as aborts:
            list(aborts.map(one, running))

    pool = ThreadPoolExecutor(max_workers=concurrency)
    slots = [pool.submit(slot) for _ in range(concurrency)]
    try:
        set_done.wait()  # every request ends within send's own timeout, with a reply, an error or a raise
        set_end = time.perf_counter() - start
        while True:
            abort_running()
            if not wait(slots, timeout=ABORT_AGAIN_S).not_done:
                break
    finally:
        # Interrupted too: nothing more is sent, and what runs is asked to end.
        with lock:
            state["stopping"] = True
        abort_running()
        pool.shutdown()
    for done in slots:
        done.result()
    cpu = host_cpu(cpu_before, cpu_times())
    late = sum(1 for _, _, end in finished if end - set_end > DRAIN_LIMIT_S)
    ok = [r for _, r, _ in finished if "error" not in r]
    tokens = sum(len(r.get("output_ids") or []) for r in ok)
    steps = sum(int((r.get("meta_info") or {}).get("spec_verify_ct") or 0) for r in ok)
    cut = sum(1 for r in ok if finish_type(r) == "abort")
    wall = max(end for _, _, end in finished)
    repeat = Repeat(tokens, wall, len(finished), cut, steps, len(finished) - len(ok), started, cpu, late)
    return repeat, [(index, reply) for index, reply, _ in finished]


def finish_type(reply: dict) -> str | None:
    reason = (reply.get("meta_info") or {}).get("finish_reason")
    return reason.get("type") if isinstance(reason, dict) else reason


def checked_outputs(replies: list[tuple[int, dict]], new_tokens: int):
    """(prompt index, output ids[, tokens to compare]) of the replies that did not fail: an
    aborted one is compared up to where it stopped, and never past the new_tokens asked for.
    SGLang 0.5.17 answers an abort that lands in the step crossing max_new_tokens with all of
    that step's tokens (Req.update_finish_state takes the abort before the length check), so a
    speculative server's aborted reply can hold up to a block more than was asked."""
    for index, reply in replies:
        if "error" in reply:
            continue
        ids = reply.get("output_ids") or []
        if finish_type(reply) == "abort":
            ids = ids[:new_tokens]
            yield index, ids, len(ids)
        else:
            yield index, ids


def latency_pass(url: str, prompts: list[list[int]], params: dict, concurrency: int, order: list[int],
                 timeout_s: float) -> dict:
    """One streamed pass through `k26-deploy bench`'s client: TTFT and ITL (the gaps between
    streamed chunks) as that command reports them, and the pass's tok/s."""

    async def go():
        async with ServerClient(url, None, timeout_s, concurrency) as client:
            return await asyncio.gather(*(client.generate({"input_ids": prompts[i], "sampling_params": params})
                                          for i in order))

    records = asyncio.run(go())
    ok = [r for r in records if r.ok]
    # The rate of `concurrency` requests in flight, from the requests' own latencies: a short
    # pass's wall time is mostly the client's start.
    busy_s = sum(r.latency_s for r in ok) / concurrency
    tokens = sum(r.completion_tokens for r in ok)
    # A cell's first requests can wait seconds for their first token (a cold server), which at
    # C=1 would halve the pass's rate; a repeat's set is planned on the rate without that wait.
    decode_s = sum(r.latency_s - (r.ttft_s or 0.0) for r in ok) / concurrency
    return {"requests": len(records), "errors": len(records) - len(ok),
            "tok_per_s": tokens / busy_s if busy_s > 0 else 0.0,
            "decode_tok_per_s": tokens / decode_s if decode_s > 0 else 0.0,
            "ttft_ms": distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
            "itl_ms": distribution_ms([gap for r in ok for gap in r.chunk_gaps_s])}


AfterRound = Callable[[str, dict, int, int, float], None]


def measure(servers: list[Measured], spec: SpeedSpec, prompts: list[list[int]], reference: dict | None,
            rule: lossless.TieRule, send: Send, abort: Abort,
            deadline: float, say: Callable[[str], None], after_round: AfterRound | None = None) -> list[dict]:
    """The summaries (CellResult.summary) of every cell of `spec` on every server (objects with
    .spec.name, .spec.speculative, .url), interleaved; rounds the deadline leaves no time
    for are not started, and the cell says so. Per cell every server first makes one streamed
    pass of max(C, 2) requests (untimed for the table; its TTFT and ITL are the cell's), whose
    fastest rate, its requests' waits for a first token left out, sets a repeat's set
    (repeat_count). after_round(cell name, cell, round, rounds, seconds the cell's remaining
    rounds need), if given, runs after each round (the costs measured inside the table:
    tuning.TableCosts)."""
    results = []
    speculative = {s.spec.name: s.spec.speculative for s in servers}
    for cell_name, cell in spec.cells.items():
        concurrency = int(cell["concurrency"])
        params = sampling_params(cell, spec.new_tokens)
        greedy = float(cell["temperature"]) == 0.0
        by_server = {s.spec.name: CellResult(s.spec.name, cell_name, checked=greedy and reference is not None)
                     for s in servers}
        warm = repeat_order(len(prompts), max(concurrency, 2), 0)
        rates, decode_rates = [], []
        for server in servers:
            if time.time() > deadline:
                break
            latency = latency_pass(server.url, prompts, params, concurrency, warm, max(5.0, deadline - time.time()))
            by_server[server.spec.name].latency = latency
            rates.append(latency["tok_per_s"])
            decode_rates.append(latency["decode_tok_per_s"])
        count = repeat_count(concurrency, max(decode_rates, default=0.0), spec.new_tokens, spec.min_seconds)
        # Before a round has run: every server as slow as the slowest warm pass, and above C=1 a
        # set's last request twice as long as the mean (one slot serves its set in turn).
        tail = 2.0 if concurrency > 1 else 1.0
        round_s = tail * len(servers) * count * spec.new_tokens / max(min(rates, default=0.0), 1e-9)
        kept, r, first, grown = 0, 0, 0, []
        while kept < spec.repeats:
            if time.time() + round_s > deadline:
                for result in by_server.values():
                    result.note = f"cut at the run deadline after {len(result.repeats)} repeats"
                break
            began = time.time()
            order = repeat_order(len(prompts), count, first)
            done = []
            for server in servers[r % len(servers):] + servers[: r % len(servers)]:
                result = by_server[server.spec.name]
                repeat, replies = run_repeat(send, abort, server.url, prompts, params, concurrency, order)
                done.append((result, repeat))
                if result.checked:
                    result.divergences += lossless.divergences(checked_outputs(replies, spec.new_tokens), reference,
                                                               rule)
            r += 1
            first = (first + count) % len(prompts)
            round_s = time.time() - began
            shortest = min(repeat.wall_s for _, repeat in done)
            if shortest < spec.min_seconds and not any(repeat.errors for _, repeat in done):
                # The warm pass overrated the fastest server: this round is not kept, and the
                # set grows so that it too lasts min_seconds.
                before = count
                count = regrown_count(count, concurrency, spec.min_seconds, shortest)
                round_s *= count / before
                grown.append(f"{before}->{count}")
                continue
            for result, repeat in done:
                result.repeats.append(repeat)
            kept += 1
            if after_round is not None:
                after_round(cell_name, cell, kept - 1, spec.repeats, (spec.repeats - kept) * round_s)
        for result in by_server.values():
            result.regrown = grown
            s = result.summary(speculative[result.server])
            say(f"speed {cell_name} {result.server}: median {s['median_tok_s']} tok/s "
                f"({s['min_tok_s']}-{s['max_tok_s']}, {s['repeats']} repeats of a set of {count} requests) "
                f"accept {s['accept_length']} {s['verdict']}")
            results.append(s)
    return results


def interval(summary: dict, baseline: dict) -> list[float] | None:
    """The 95 % interval of one cell's ratio to the baseline server's cell of the same table."""
    return ratio_interval({"table_repeats": [summary.get("repeat_tok_s") or []]},
                          {"table_repeats": [baseline.get("repeat_tok_s") or []]})


def _ratio_text(s: dict | None, base: dict | None) -> str:
    if not s or not base or not s["median_tok_s"] or not base["median_tok_s"]:
        return "-"
    bounds = interval(s, base)
    text = f"{s['median_tok_s'] / base['median_tok_s']:.2f}"
    return text + (f" [{bounds[0]:.2f}-{bounds[1]:.2f}]" if bounds else "")


def _ms(latency: dict | None, key: str) -> str:
    dist = (latency or {}).get(key) or {}
    if dist.get("p50") is None:
        return "-"
    return f"{dist['p50']:.1f} / {dist['p99']:.1f}"


def markdown(run: str, summaries: list[dict], baseline: str, spec: SpeedSpec, device: str, prompts: int) -> str:
    cells = list(spec.cells)
    servers = list(dict.fromkeys(s["server"] for s in summaries))
    by = {(s["server"], s["cell"]): s for s in summaries}
    lines = [f"# Speed, run {run}", "",
             f"{device}; {spec.new_tokens} new tokens per request (ignore_eos), {prompts} prompts; each cell the "
             f"median of its interleaved repeats ({spec.repeats} planned; a run's deadline can cut a cell short, "
             f"and the cell's table says how many ran) of >= {spec.min_seconds} s inside one server start, "
             f"every server's repeat r serving the same set of prompts. tok/s: the rate while all C slots are "
             "busy (free slots take fillers, the prompts after the set, until the set's last reply; the fillers "
             "still running are then aborted; a repeat's tokens over the time to its last reply). "
             f"x{baseline}: the ratio of medians, with its 95 % "
             "bootstrap interval over the rounds. TTFT and ITL (the gaps between streamed chunks): p50 / p99 ms of "
             "one streamed pass of max(C, 2) requests per cell, through `k26-deploy bench`'s client.", "",
             f"## x{baseline}", "",
             "| server | " + " | ".join(cells) + " |", "|---|" + "---|" * len(cells)]
    for name in servers:
        lines.append(f"| {name} | " + " | ".join(_ratio_text(by.get((name, c)), by.get((baseline, c)))
                                                 for c in cells) + " |")
    for cell in cells:
        lines += ["", f"## {cell}", "", "| server | tok/s (min-max) | repeats | x" + baseline + " | accept | TTFT ms | "
                  "ITL ms | lossless | ties stopped |", "|---|---|---|---|---|---|---|---|---|"]
        for name in servers:
            s = by.get((name, cell))
            if s is None or s["median_tok_s"] is None:
                continue
            stops = s.get("stopped_early") or {}
            where = f" at {stops['positions']}" if stops.get("positions") else ""
            lines.append(f"| {name} | {s['median_tok_s']:.0f} ({s['min_tok_s']:.0f}-{s['max_tok_s']:.0f}) | "
                         f"{len(s['repeat_tok_s'])} | "
                         f"{_ratio_text(s, by.get((baseline, cell)))} | "
                         f"{'' if s['accept_length'] is None else format(s['accept_length'], '.2f')} | "
                         f"{_ms(s.get('latency'), 'ttft_ms')} | {_ms(s.get('latency'), 'itl_ms')} | {s['verdict']} | "
                         f"{stops.get('requests', 0)}{where} |")
    lines.append("")
    return "\n".join(lines)

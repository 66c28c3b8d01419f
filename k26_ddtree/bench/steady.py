"""The steady-state cell of `bench run --steady`: repeats of a closed loop (`closed_loop.py`)
of plain (not streamed) /generate requests, summarized as one cell.

`tune` reads a cell's step time as C * accept_length / output_tok_s. A cell that sends its
requests once ramps up, runs in waves and tails off, so that quotient is not what a server
serving C requests steadily spends; a closed loop keeps the batch at C, as the proving
ground's speed table does, and the median over repeats steadies the number. A repeat's last
requests would still leave it on a thinning batch (a speculative request's steps depend on its
prompt), so once its set is sent free slots take fillers, the prompts after it, until the set's
last reply; the fillers still running are then aborted by their rid, and their tokens so far
count. A server that refuses the aborts lets them finish, and the repeat says so.
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from dataclasses import dataclass, field

from k26_ddtree.bench.client import GenerateRecord, ServerClient
from k26_ddtree.bench.closed_loop import ClosedLoop
from k26_ddtree.bench.metrics import summarize_cell


@dataclass
class SteadyRepeat:
    wall_s: float  # from the first request to the last reply
    records: list[GenerateRecord]  # the set's: the cell's requests
    fillers: list[GenerateRecord] = field(default_factory=list)

    @property
    def counted(self) -> list[GenerateRecord]:
        """The cell's requests: the set's, and any filler that failed otherwise than by its abort."""
        return self.records + [r for r in self.fillers if not r.ok and not r.aborted]

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.records if r.ok) + sum(r.completion_tokens for r in self.fillers)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def describe(self) -> dict:
        return {
            "tok_s": self.tok_s,
            "wall_s": self.wall_s,
            "requests": len(self.counted),
            "output_tokens": self.output_tokens,
            "spec_verify_ct": sum(r.spec_verify_ct for r in self.records if r.ok)
            + sum(r.spec_verify_ct for r in self.fillers),
            "fillers": len(self.fillers),
            "fillers_aborted": sum(r.aborted for r in self.fillers),
        }


# While a repeat's fillers are aborted, the aborts of those still running are sent again this
# often: an abort that reaches the server before its request is dropped there.
ABORT_AGAIN_S = 0.25


async def run_repeat(client: ServerClient, prompts: list[dict], concurrency: int, sampling: dict,
                     seconds: float, first: int) -> SteadyRepeat:
    """One repeat: `concurrency` slots, each taking the next prompt as soon as its request ends,
    over whole cycles of the prompts for at least `seconds` (its set); then fillers until the
    set's last reply, and the fillers still running aborted."""
    start = time.perf_counter()
    loop = ClosedLoop(len(prompts), concurrency, seconds, start, first)
    tag = f"k26-bench-{uuid.uuid4().hex[:12]}"
    records: list[GenerateRecord] = []
    fillers: list[GenerateRecord] = []
    running: set[str] = set()  # the fillers in flight
    state = {"set_left": 0, "closed": False, "fillers": 0, "last_reply": start}
    set_done = asyncio.Event()

    def returned() -> None:
        state["last_reply"] = time.perf_counter()
        if state["closed"] and state["set_left"] == 0:
            set_done.set()

    async def slot() -> None:
        while not set_done.is_set():
            index = loop.take(time.perf_counter())
            if index is not None:
                state["set_left"] += 1
                try:
                    records.append(await client.generate_unstreamed({**prompts[index], "sampling_params": sampling}))
                finally:
                    state["set_left"] -= 1
                    returned()
                continue
            state["closed"] = True
            if state["set_left"] == 0:
                returned()
                return
            number = state["fillers"]
            state["fillers"] += 1
            rid = f"{tag}-{number:06d}"  # SGLang aborts every rid that starts with the one named
            running.add(rid)
            index = (first + loop.issued + number) % len(prompts)
            try:
                fillers.append(await client.generate_unstreamed(
                    {**prompts[index], "sampling_params": sampling, "rid": rid}))
            finally:
                running.discard(rid)
                state["last_reply"] = time.perf_counter()

    async def abort_running() -> bool:
        """Asks the server to end every filler still running, all at once (the batch thins while
        they go out); False where it refused them all."""
        asked = sorted(running)
        taken = await asyncio.gather(*(client.abort(rid) for rid in asked))
        return not asked or any(taken)

    slots = [asyncio.ensure_future(slot()) for _ in range(concurrency)]
    waiting = asyncio.ensure_future(set_done.wait())
    try:
        # Every request ends within the client's request timeout, so the set does; a slot that
        # fails otherwise ends the wait too, and its error is raised below.
        await asyncio.wait([waiting, *slots], return_when=asyncio.FIRST_COMPLETED)
        while await abort_running():
            _, pending = await asyncio.wait(slots, timeout=ABORT_AGAIN_S)
            if not pending:
                break
        # where the server takes no aborts, the fillers run to their end
        await asyncio.gather(*slots)
    finally:
        waiting.cancel()
        if not all(task.done() for task in slots):
            # Interrupted: what runs on the server is asked to end before the tasks are dropped.
            set_done.set()
            try:
                await asyncio.wait_for(abort_running(), ABORT_AGAIN_S * 8)
            except asyncio.TimeoutError:
                pass  # best effort: the error or interruption that got here is what is raised
            for task in slots:
                task.cancel()
    return SteadyRepeat(state["last_reply"] - start, records, fillers)


def summarize_steady(*, context: int, concurrency: int, output_len: int, planned: int, seconds: float,
                     repeats: list[SteadyRepeat], server_info: dict | None, interrupted: bool = False) -> dict:
    """The cell's JSON object: every field of a normal cell over all repeats' requests, but
    output_tok_s the median of the repeats' rates, and the repeats under "steady"."""
    cell = summarize_cell(
        context=context,
        concurrency=concurrency,
        output_len=output_len,
        planned=planned,
        records=[r for repeat in repeats for r in repeat.counted],
        duration_s=sum(repeat.wall_s for repeat in repeats),
        server_info=server_info,
        interrupted=interrupted,
    )
    rates = [repeat.tok_s for repeat in repeats]
    cell["output_tok_s"] = statistics.median(rates) if cell["ok"] else None
    cell["steady"] = {
        "seconds": seconds,
        "repeats": [repeat.describe() for repeat in repeats],
        "min_tok_s": min(rates),
        "max_tok_s": max(rates),
    }
    return cell


def repeat_line(number: int, total: int, repeat: SteadyRepeat) -> str:
    errors = sum(not r.ok for r in repeat.counted)
    line = f"repeat {number}/{total}: {repeat.tok_s:.1f} tok/s, {len(repeat.counted)} requests in {repeat.wall_s:.2f}s"
    return line + (f", ERRORS {errors}" if errors else "")

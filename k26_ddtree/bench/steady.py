"""The steady-state cell of `bench run --steady`: repeats of a closed loop (`closed_loop.py`)
of plain (not streamed) /generate requests, summarized as one cell.

`tune` reads a cell's step time as C * accept_length / output_tok_s. A cell that sends its
requests once ramps up, runs in waves and tails off, so that quotient is not what a server
serving C requests steadily spends; a closed loop keeps the batch at C, as the proving
ground's speed table does, and the median over repeats steadies the number.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass

from k26_ddtree.bench.client import GenerateRecord, ServerClient
from k26_ddtree.bench.closed_loop import ClosedLoop
from k26_ddtree.bench.metrics import summarize_cell


@dataclass
class SteadyRepeat:
    wall_s: float
    records: list[GenerateRecord]

    @property
    def output_tokens(self) -> int:
        return sum(r.completion_tokens for r in self.records if r.ok)

    @property
    def tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def describe(self) -> dict:
        return {
            "tok_s": self.tok_s,
            "wall_s": self.wall_s,
            "requests": len(self.records),
            "output_tokens": self.output_tokens,
            "spec_verify_ct": sum(r.spec_verify_ct for r in self.records if r.ok),
        }


async def run_repeat(client: ServerClient, prompts: list[dict], concurrency: int, sampling: dict,
                     seconds: float, first: int) -> SteadyRepeat:
    """One repeat: `concurrency` slots, each taking the next prompt as soon as its request ends."""
    start = time.perf_counter()
    loop = ClosedLoop(len(prompts), concurrency, seconds, start, first)
    records: list[GenerateRecord] = []

    async def slot() -> None:
        while (index := loop.take(time.perf_counter())) is not None:
            records.append(await client.generate_unstreamed({**prompts[index], "sampling_params": sampling}))

    await asyncio.gather(*(slot() for _ in range(concurrency)))
    return SteadyRepeat(time.perf_counter() - start, records)


def summarize_steady(*, context: int, concurrency: int, output_len: int, planned: int, seconds: float,
                     repeats: list[SteadyRepeat], server_info: dict | None, interrupted: bool = False) -> dict:
    """The cell's JSON object: every field of a normal cell over all repeats' requests, but
    output_tok_s the median of the repeats' rates, and the repeats under "steady"."""
    cell = summarize_cell(
        context=context,
        concurrency=concurrency,
        output_len=output_len,
        planned=planned,
        records=[r for repeat in repeats for r in repeat.records],
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
    errors = sum(not r.ok for r in repeat.records)
    line = f"repeat {number}/{total}: {repeat.tok_s:.1f} tok/s, {len(repeat.records)} requests in {repeat.wall_s:.2f}s"
    return line + (f", ERRORS {errors}" if errors else "")

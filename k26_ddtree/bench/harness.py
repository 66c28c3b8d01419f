"""The context x concurrency matrix: warm-up, flush, measure, summarize, save, per cell.

A cell measures its requests sent once (streamed, with TTFT and ITL), or, with
`steady_seconds`, repeats of a closed loop (`steady.py`) for the steady-state step time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from k26_ddtree.bench.cells import CellProgress
from k26_ddtree.bench.client import GenerateRecord, ServerClient
from k26_ddtree.bench.metrics import summarize_cell
from k26_ddtree.bench.prompts import PromptFactory
from k26_ddtree.bench.results import RunWriter
from k26_ddtree.bench.steady import SteadyRepeat, repeat_line, run_repeat, summarize_steady
from k26_ddtree.errors import UserError


@dataclass(frozen=True)
class MatrixSettings:
    contexts: tuple[int, ...]
    concurrencies: tuple[int, ...]
    output_len: int
    requests_per_cell: int | None  # None: max(8, 2*C)
    warmup: int
    temperature: float
    ignore_eos: bool
    steady_seconds: float | None = None  # --steady: closed-loop repeats of at least this long
    repeats: int = 5
    prompt_set_size: int | None = None  # --prompt-set: a cell's prompts are whole cycles of the set

    def requests_for(self, concurrency: int) -> int:
        if self.requests_per_cell:
            return self.requests_per_cell
        if self.prompt_set_size:
            # Enough whole cycles of the set that a cell labelled C has C requests in flight.
            return self.prompt_set_size * -(-concurrency // self.prompt_set_size)
        return max(8, 2 * concurrency)

    def for_prompt_set(self, context: int, size: int) -> "MatrixSettings":
        """The matrix over a prompt set: its one context (the mean prompt length), its size per cell."""
        return dataclasses.replace(self, contexts=(context,), prompt_set_size=size)

    def describe(self) -> dict:
        return {
            "contexts": list(self.contexts),
            "concurrencies": list(self.concurrencies),
            "output_len": self.output_len,
            "requests_per_cell": self.requests_per_cell or (
                f"the {self.prompt_set_size} prompts of the set, whole cycles of at least C" if self.prompt_set_size
                else "max(8, 2*C)"),
            "warmup_per_cell": self.warmup,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
            "steady": None if self.steady_seconds is None else {"seconds": self.steady_seconds,
                                                                 "repeats": self.repeats},
        }

    def sampling_params(self) -> dict:
        return {"max_new_tokens": self.output_len, "ignore_eos": self.ignore_eos, "temperature": self.temperature}


async def _drive(
    client: ServerClient,
    prompts: list[dict],
    concurrency: int,
    sampling: dict,
    records: list[GenerateRecord],
    progress: CellProgress | None,
) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: dict) -> None:
        async with gate:
            record = await client.generate({**prompt, "sampling_params": sampling})
        records.append(record)
        if progress is not None:
            progress.request_done(record.ok)

    await asyncio.gather(*(one(p) for p in prompts))


def _cell_line(cell: dict) -> str:
    rate = cell["output_tok_s"]
    accept = cell["accept_length"]
    parts = [f"{rate:.1f} tok/s" if rate is not None else "no tokens"]
    if accept is not None:
        parts.append(f"accept {accept:.2f}")
    parts.append(f"ok {cell['ok']}/{cell['requests']}")
    if cell["errors"]:
        parts.append(f"ERRORS {cell['errors']}")
    return ", ".join(parts)


async def _server_info_or_none(client: ServerClient) -> dict | None:
    try:
        return await client.server_info()
    except UserError:
        return None


class _Cell:
    """One (context, concurrency) cell: its settings, the requests it plans, and the preparation
    both kinds share (progress, warm-up, flush, the prompts to measure)."""

    def __init__(self, settings: MatrixSettings, context: int, concurrency: int):
        self.settings, self.context, self.concurrency = settings, context, concurrency
        self.planned = settings.requests_for(concurrency)

    async def _prepare(self, client: ServerClient, factory: PromptFactory, progress: CellProgress, units: int,
                       unit: str) -> list[dict]:
        progress.start_cell(f"ctx {self.context} C {self.concurrency}", units, unit=unit)
        if self.settings.warmup:
            warm = factory.prompts(self.context, self.settings.warmup, salt="warmup")
            await _drive(client, warm, self.concurrency, self.settings.sampling_params(), [], None)
        await client.flush_cache()
        return factory.prompts(self.context, self.planned, salt="measure")


class _OnceCell(_Cell):
    """The cell's requests sent once, streamed, at most C in flight."""

    def __init__(self, settings: MatrixSettings, context: int, concurrency: int):
        super().__init__(settings, context, concurrency)
        self.records: list[GenerateRecord] = []
        self.start = self.end = None

    @property
    def measured(self) -> bool:
        return bool(self.records)

    async def measure(self, client: ServerClient, factory: PromptFactory, progress: CellProgress) -> None:
        prompts = await self._prepare(client, factory, progress, self.planned, "req")
        self.start = time.perf_counter()
        await _drive(client, prompts, self.concurrency, self.settings.sampling_params(), self.records, progress)
        self.end = time.perf_counter()

    def summary(self, server_info: dict | None, interrupted: bool = False) -> dict:
        end = self.end if self.end is not None else time.perf_counter()
        return summarize_cell(context=self.context, concurrency=self.concurrency,
                              output_len=self.settings.output_len, planned=self.planned, records=self.records,
                              duration_s=end - self.start, server_info=server_info, interrupted=interrupted)


class _SteadyCell(_Cell):
    """The cell's prompts as the cycle of `repeats` closed loops, plain requests, exactly C in flight."""

    def __init__(self, settings: MatrixSettings, context: int, concurrency: int):
        super().__init__(settings, context, concurrency)
        self.repeats: list[SteadyRepeat] = []

    @property
    def measured(self) -> bool:
        return bool(self.repeats)

    async def measure(self, client: ServerClient, factory: PromptFactory, progress: CellProgress) -> None:
        total = self.settings.repeats
        prompts = await self._prepare(client, factory, progress, total, "repeat")
        for number in range(total):
            repeat = await run_repeat(client, prompts, self.concurrency, self.settings.sampling_params(),
                                      self.settings.steady_seconds, first=number % len(prompts))
            self.repeats.append(repeat)
            progress.repeat_done(repeat_line(number + 1, total, repeat))

    def summary(self, server_info: dict | None, interrupted: bool = False) -> dict:
        return summarize_steady(context=self.context, concurrency=self.concurrency,
                                output_len=self.settings.output_len, planned=self.planned,
                                seconds=self.settings.steady_seconds, repeats=self.repeats,
                                server_info=server_info, interrupted=interrupted)


async def run_matrix(
    client: ServerClient,
    settings: MatrixSettings,
    factory: PromptFactory,
    writer: RunWriter,
    progress: CellProgress,
) -> None:
    """Run every cell in order, appending each finished cell to the run and saving it.

    On cancellation (Ctrl-C) what the cell in flight already measured (its finished requests,
    or its finished repeats) is summarized as an interrupted cell before the cancel goes on.
    """
    run = writer.run
    kind = _OnceCell if settings.steady_seconds is None else _SteadyCell
    for context in settings.contexts:
        for concurrency in settings.concurrencies:
            measuring = kind(settings, context, concurrency)
            try:
                await measuring.measure(client, factory, progress)
            except asyncio.CancelledError:
                if measuring.measured:
                    run["cells"].append(measuring.summary(None, interrupted=True))
                raise
            cell = measuring.summary(await _server_info_or_none(client))
            run["cells"].append(cell)
            writer.save()
            progress.end_cell(_cell_line(cell))

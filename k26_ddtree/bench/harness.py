"""The context x concurrency matrix: warm-up, flush, measure, summarize, save, per cell."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from k26_ddtree.bench.cells import CellProgress
from k26_ddtree.bench.client import GenerateRecord, ServerClient
from k26_ddtree.bench.metrics import summarize_cell
from k26_ddtree.bench.prompts import PromptFactory
from k26_ddtree.bench.results import RunWriter
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

    def requests_for(self, concurrency: int) -> int:
        return self.requests_per_cell or max(8, 2 * concurrency)

    def describe(self) -> dict:
        return {
            "contexts": list(self.contexts),
            "concurrencies": list(self.concurrencies),
            "output_len": self.output_len,
            "requests_per_cell": self.requests_per_cell or "max(8, 2*C)",
            "warmup_per_cell": self.warmup,
            "temperature": self.temperature,
            "ignore_eos": self.ignore_eos,
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


async def run_matrix(
    client: ServerClient,
    settings: MatrixSettings,
    factory: PromptFactory,
    writer: RunWriter,
    progress: CellProgress,
) -> None:
    """Run every cell in order, appending each finished cell to the run and saving it.

    On cancellation (Ctrl-C) the requests of the cell in flight that already
    finished are summarized as an interrupted cell before the cancel goes on.
    """
    run = writer.run
    sampling = settings.sampling_params()
    for context in settings.contexts:
        for concurrency in settings.concurrencies:
            planned = settings.requests_for(concurrency)
            progress.start_cell(f"ctx {context} C {concurrency}", planned)
            records: list[GenerateRecord] = []
            start = time.perf_counter()
            try:
                if settings.warmup:
                    warm = factory.prompts(context, settings.warmup, salt="warmup")
                    await _drive(client, warm, concurrency, sampling, [], None)
                await client.flush_cache()
                prompts = factory.prompts(context, planned, salt="measure")
                start = time.perf_counter()
                await _drive(client, prompts, concurrency, sampling, records, progress)
            except asyncio.CancelledError:
                if records:
                    run["cells"].append(
                        summarize_cell(
                            context=context,
                            concurrency=concurrency,
                            output_len=settings.output_len,
                            planned=planned,
                            records=records,
                            duration_s=time.perf_counter() - start,
                            server_info=None,
                            interrupted=True,
                        )
                    )
                raise
            duration = time.perf_counter() - start
            cell = summarize_cell(
                context=context,
                concurrency=concurrency,
                output_len=settings.output_len,
                planned=planned,
                records=records,
                duration_s=duration,
                server_info=await _server_info_or_none(client),
            )
            run["cells"].append(cell)
            writer.save()
            progress.end_cell(_cell_line(cell))

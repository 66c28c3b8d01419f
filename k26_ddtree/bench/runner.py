"""One benchmark run end to end: wait for the server, record who it is, run the matrix and/or the eval."""

from __future__ import annotations

import asyncio
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from k26_ddtree.bench.cells import CellProgress
from k26_ddtree.bench.client import ServerClient
from k26_ddtree.bench.coding_eval import EvalSettings, run_coding_eval
from k26_ddtree.bench.harness import MatrixSettings, run_matrix
from k26_ddtree.bench.prompts import PromptFactory, PromptSource
from k26_ddtree.bench.results import RunWriter, algorithm_of, git_sha, new_run_id, run_label, scrub_secrets, utc_now
from k26_ddtree.bench.vocab import served_vocabulary
from k26_ddtree.errors import UserError
from k26_ddtree.progress import Reporter


@dataclass(frozen=True)
class RunOptions:
    url: str
    api_key: str | None
    out: Path
    label: str | None
    profile: str | None
    budget: int | None
    topk: int | None
    snapshot_id: str | None
    request_timeout_s: float
    ready_timeout_s: float
    quiet: bool
    matrix: MatrixSettings | None
    prompts: PromptSource | None
    coding_eval: EvalSettings | None

    def max_connections(self) -> int:
        matrix = max(self.matrix.concurrencies) if self.matrix else 1
        evaluation = self.coding_eval.concurrency if self.coding_eval else 1
        return max(matrix, evaluation) + 4


def _new_run(options: RunOptions, server_info: dict, factory: PromptFactory | None) -> dict:
    budget = options.budget if options.budget is not None else server_info.get("speculative_ddtree_budget")
    topk = options.topk if options.topk is not None else server_info.get("speculative_ddtree_topk")
    return {
        "run_id": new_run_id(),
        "label": options.label or run_label(server_info, budget, topk),
        "status": "running",
        "started_at": utc_now(),
        "finished_at": None,
        "failure": None,
        "server_url": options.url,
        "profile": options.profile,
        "algorithm": algorithm_of(server_info),
        "budget": budget,
        "topk": topk,
        "schedule": server_info.get("speculative_ddtree_budget_schedule"),
        "git_sha": git_sha(),
        "snapshot_id": options.snapshot_id,
        "model": server_info.get("served_model_name") or server_info.get("model_path"),
        "settings": {
            "matrix": options.matrix.describe() if options.matrix else None,
            "prompts": factory.describe() if factory else None,
            "request_timeout_s": options.request_timeout_s,
        },
        "server_info": server_info,
        "cells": [],
        "coding_eval": None,
    }


async def _run(options: RunOptions, holder: dict) -> None:
    factory = PromptFactory(options.prompts) if options.matrix else None  # a bad --prompt-file fails first
    if factory is not None and factory.prompt_set is not None:
        prompt_set = factory.prompt_set
        options = dataclasses.replace(options, matrix=options.matrix.for_prompt_set(prompt_set.context,
                                                                                     len(prompt_set.prompts)))
    reporter = Reporter(sys.stderr, quiet=options.quiet)
    client = ServerClient(options.url, options.api_key, options.request_timeout_s, options.max_connections())
    async with client:
        await client.wait_healthy(options.ready_timeout_s, reporter.line)
        server_info = scrub_secrets(await client.server_info())
        if factory is not None and factory.needs_vocabulary:
            model_info = await client.model_info()
            factory.limit_to(served_vocabulary(options.prompts.vocab_size, model_info, server_info, options.url))
        writer = RunWriter(options.out, _new_run(options, server_info, factory))
        holder["writer"] = writer
        writer.save()
        cells = len(options.matrix.contexts) * len(options.matrix.concurrencies) if options.matrix else 0
        endpoints = len(options.coding_eval.endpoints) if options.coding_eval else 0
        progress = CellProgress(cells + endpoints, reporter)
        reporter.line(f"bench: {writer.run['label']} at {options.url} -> {options.out}")
        if options.matrix:
            await run_matrix(client, options.matrix, factory, writer, progress)
        if options.coding_eval:
            writer.run["coding_eval"] = await run_coding_eval(client, options.coding_eval, progress)
        writer.run["status"] = "complete"
        writer.run["finished_at"] = utc_now()
        writer.save()


def execute_run(options: RunOptions) -> dict:
    """Run and return the run object; the results file holds it whatever happens.

    Ctrl-C marks the run "interrupted" and re-raises KeyboardInterrupt; a user
    error mid-run (server gone, flush refused) marks it "failed".
    """
    holder: dict = {}
    try:
        asyncio.run(_run(options, holder))
    except (KeyboardInterrupt, UserError) as err:
        writer = holder.get("writer")
        if writer is not None:
            interrupted = isinstance(err, KeyboardInterrupt)
            writer.run["status"] = "interrupted" if interrupted else "failed"
            writer.run["failure"] = None if interrupted else str(err)
            writer.run["finished_at"] = utc_now()
            writer.save()
        raise
    return holder["writer"].run

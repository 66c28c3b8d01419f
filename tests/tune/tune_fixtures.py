"""Real inputs for `tune`: trace files packed by the trace module, bench results files made by the bench code."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from k26_ddtree.bench.client import GenerateRecord
from k26_ddtree.bench.metrics import summarize_cell
from k26_ddtree.bench.results import (SCHEMA, algorithm_of, load_results, new_run_id, run_label, utc_now,
                                     write_json_atomic)
from k26_ddtree.core.acceptance import DraftTopK, TreeShape, committed_per_root
from k26_ddtree.sglang.common import trace

MODEL = "/models/Kimi-K2.6"
OUTPUT_LEN = 256


def header(depth: int, **overrides) -> dict:
    meta = {"depth": depth, "topk": trace.TOPK, "model": MODEL, "drafter": MODEL + "-DFlash", "served": "1:8/4",
            "spine": True, "block_size": depth + 1, "started": "2026-12-01T10:00:00Z"}
    return {**meta, **overrides}


def write_trace(path: Path, meta: dict, records: list[bytes]) -> Path:
    path.write_bytes(trace.header_bytes(meta) + b"".join(records))
    return path


def sequence_table(seq: list[int], tokens: torch.Tensor, logprobs: torch.Tensor) -> DraftTopK:
    """The drafter's top-8 at every root of one generated text seq (root a = seq[a]); the truth after a
    root is the text that follows it, -1 past its end."""
    depth = tokens.shape[1]
    padded = seq + [-1] * (depth + 1)
    roots = len(seq) - 1
    truth = torch.tensor([padded[a + 1:a + depth + 2] for a in range(roots)])
    return DraftTopK(tokens=tokens[:roots], logprobs=logprobs[:roots], truth=truth, roots=torch.tensor(seq[:roots]))


def walk_records(table: DraftTopK, served: TreeShape, rid: str) -> tuple[list[int], list[bytes]]:
    """The records a server serving `served` writes for this request: it decodes from root 0 and
    each step moves on by what the step committed. Returns (visited roots, records)."""
    committed = committed_per_root(table, served).tolist()
    visited, at = [], 0
    while at < len(committed):
        visited.append(at)
        at += committed[at]
    records = []
    for number, a in enumerate(visited):
        tokens = table.truth[a, :committed[a]].tolist()
        records.append(trace.pack_records([trace.request_key(rid)], [number], [int(table.roots[a])],
                                          table.tokens[a:a + 1], table.logprobs[a:a + 1], [tokens]))
    return visited, records


def random_table(seed: int, length: int, depth: int, vocab: int = 6) -> DraftTopK:
    """A drafter that often ranks the true token 1st and sometimes 2nd-8th: trees beat the chain."""
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (length,), generator=gen).tolist()
    padded = seq + [-1] * (depth + 1)
    tokens = torch.randint(100, 200, (length, depth, trace.TOPK), generator=gen)
    rank = torch.randint(0, trace.TOPK, (length, depth), generator=gen)
    rank = torch.where(torch.rand(length, depth, generator=gen) < 0.6, 0, rank)
    for a in range(length):
        for d in range(depth):
            if padded[a + 1 + d] >= 0:
                tokens[a, d, rank[a, d]] = padded[a + 1 + d]
    logprobs = torch.log_softmax(torch.randn(length, depth, trace.TOPK, generator=gen) * 2, -1)
    logprobs = logprobs.sort(-1, descending=True).values
    return sequence_table(seq, tokens, logprobs)


def _cell(context: int, concurrency: int, step_s: float, accept: float | None, errors: int = 0) -> dict:
    """A cell as the bench writes it, for requests whose batch took step_s per decode step."""
    requests = max(8, 2 * concurrency)
    verify = 0 if accept is None else round(OUTPUT_LEN / accept)
    records = [GenerateRecord(ok=True, prompt_tokens=context, completion_tokens=OUTPUT_LEN, spec_verify_ct=verify,
                              latency_s=1.0, ttft_s=0.1, chunk_gaps_s=[0.01])] * requests
    records += [GenerateRecord(ok=False, error="HTTP 500: boom")] * errors
    steps = (verify if accept is not None else OUTPUT_LEN) * requests / concurrency
    return summarize_cell(context=context, concurrency=concurrency, output_len=OUTPUT_LEN, planned=len(records),
                          records=records, duration_s=step_s * steps, server_info=None)


def bench_run(step_s: Callable[[int, int], float], *, algorithm: str, budget: int | None = None,
              topk: int | None = None, accept: float | None = 3.0, contexts=(60, 1024),
              concurrencies=(1, 4, 16, 64), model: str = MODEL, block_size: int = 8,
              profile: str | None = "pcie-ep8", errors_at: set = frozenset()) -> dict:
    """One run as `k26-deploy bench` records it (bench/results/README.md); step_s(context, C) seconds."""
    server_info = {"model_path": model, "served_model_name": "kimi-k2.6",
                   "speculative_algorithm": None if algorithm == "AR" else "DFLASH",
                   "speculative_dflash_block_size": None if algorithm == "AR" else block_size}
    if algorithm == "DDTREE":
        server_info.update(speculative_ddtree_budget=budget, speculative_ddtree_topk=topk)
    cells = [_cell(ctx, c, step_s(ctx, c), None if algorithm == "AR" else accept,
                   errors=2 if (ctx, c) in errors_at else 0) for ctx in contexts for c in concurrencies]
    return {
        "run_id": new_run_id(), "label": run_label(server_info, budget, topk), "status": "complete",
        "started_at": utc_now(), "finished_at": utc_now(), "failure": None, "server_url": "http://127.0.0.1:30000",
        "profile": profile, "algorithm": algorithm_of(server_info), "budget": budget, "topk": topk,
        "git_sha": "unknown", "snapshot_id": None, "model": "kimi-k2.6",
        "settings": {"matrix": {"contexts": list(contexts), "concurrencies": list(concurrencies),
                                "output_len": OUTPUT_LEN, "requests_per_cell": "max(8, 2*C)", "warmup_per_cell": 2,
                                "temperature": 0.0, "ignore_eos": True},
                     "prompts": {"kind": "random-ids", "seed": 0, "id_range": [1000, 30000]},
                     "request_timeout_s": 600.0},
        "server_info": server_info, "cells": cells, "coding_eval": None,
    }


def write_results(path: Path, runs: list[dict]) -> Path:
    write_json_atomic(path, {"schema": SCHEMA, "runs": runs})
    load_results(path)  # the bench's own reader takes it
    return path


def tree_step_s(budget: int, topk: int = 4) -> Callable[[int, int], float]:
    """A verify-bound step: 20 ms plus 0.05 ms per token of the batch, C * (budget + 1)."""
    return lambda context, c: 0.020 + 0.00005 * c * (budget + 1) + 0.000001 * context


def sweep_runs(budgets=(8, 16, 32, 64), topks=(4, 8), **kw) -> list[dict]:
    return [bench_run(tree_step_s(b, k), algorithm="DDTREE", budget=b, topk=k, **kw) for b in budgets for k in topks]

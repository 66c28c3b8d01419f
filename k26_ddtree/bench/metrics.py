"""Per-cell numbers from the request records of one (context, concurrency) cell."""

from __future__ import annotations

import math
from statistics import fmean

from k26_ddtree.bench.client import GenerateRecord

MAX_ERROR_SAMPLES = 5


def percentile(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in 0..100), None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def distribution_ms(values_s: list[float]) -> dict:
    """mean/p50/p99 in milliseconds (None when there is nothing to measure)."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "mean": fmean(ms) if ms else None,
        "p50": percentile(ms, 50),
        "p99": percentile(ms, 99),
        "count": len(ms),
    }


def server_accept_length(server_info: dict | None) -> float | None:
    """The server's own avg_spec_accept_length (mean over data-parallel ranks)."""
    states = (server_info or {}).get("internal_states")
    if not isinstance(states, list):
        return None
    values = [
        float(state["avg_spec_accept_length"])
        for state in states
        if isinstance(state, dict) and isinstance(state.get("avg_spec_accept_length"), (int, float))
    ]
    return fmean(values) if values else None


def summarize_cell(
    *,
    context: int,
    concurrency: int,
    output_len: int,
    planned: int,
    records: list[GenerateRecord],
    duration_s: float,
    server_info: dict | None,
    interrupted: bool = False,
) -> dict:
    """The cell's JSON object (schema in bench/results/README.md)."""
    ok = [r for r in records if r.ok]
    failed = [r for r in records if not r.ok]
    output_tokens = sum(r.completion_tokens for r in ok)
    verify = sum(r.spec_verify_ct for r in ok)
    tpot = [
        (r.latency_s - r.ttft_s) / (r.completion_tokens - 1)
        for r in ok
        if r.ttft_s is not None and r.completion_tokens > 1
    ]
    request_rates = [r.completion_tokens / r.latency_s for r in ok if r.latency_s > 0]
    return {
        "context": context,
        "concurrency": concurrency,
        "output_len": output_len,
        "planned_requests": planned,
        "requests": len(records),
        "ok": len(ok),
        "errors": len(failed),
        "has_errors": bool(failed),
        "interrupted": interrupted,
        "error_samples": sorted({r.error or "unknown error" for r in failed})[:MAX_ERROR_SAMPLES],
        "duration_s": duration_s,
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration_s if duration_s > 0 and ok else None,
        "request_tok_s": {
            "mean": fmean(request_rates) if request_rates else None,
            "p50": percentile(request_rates, 50),
        },
        "ttft_ms": distribution_ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        "itl_ms": distribution_ms([gap for r in ok for gap in r.chunk_gaps_s]),
        "tpot_ms": distribution_ms(tpot),
        "e2e_ms": distribution_ms([r.latency_s for r in ok]),
        "spec_verify_ct": verify,
        "accept_length": output_tokens / verify if verify else None,
        "server_avg_spec_accept_length": server_accept_length(server_info),
        "steady": None,  # the closed-loop repeats of a --steady cell (steady.py)
    }

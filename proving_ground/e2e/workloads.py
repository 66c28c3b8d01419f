"""A workload against one server: its requests, the token ramp, and the cell it records."""

from __future__ import annotations

import http.client
import time
from concurrent.futures import ThreadPoolExecutor

from proving_ground import lossless, speed
from proving_ground.e2e.servers import post_json, REQUEST_TIMEOUT_S, Server

MIN_WORKLOAD_S = 15


def run_workload(server: Server, workload: dict, prompts: list[list[int]], new_tokens: int, want_logprobs: bool,
                 deadline: float):
    """Send the workload's requests; returns (results in prompt order, wall seconds)."""
    concurrency = int(workload["concurrency"])
    count = max(concurrency, len(prompts))
    jobs = [(i % len(prompts), prompts[i % len(prompts)], ramp_tokens(workload, new_tokens, i, count))
            for i in range(count)]

    def one(job):
        index, ids, tokens = job
        payload = {"input_ids": ids, "sampling_params": speed.sampling_params(workload, tokens)}
        if want_logprobs:
            payload.update(return_logprob=True, top_logprobs_num=2, return_text_in_logprobs=False)
        try:
            out = post_json(server.url + "/generate", payload, timeout=max(5.0, min(REQUEST_TIMEOUT_S,
                                                                                    deadline - time.time())))
        except (OSError, ValueError, http.client.HTTPException) as err:
            return {"prompt": index, "error": f"{type(err).__name__}: {err}"}
        meta = out.get("meta_info", {})
        ids_out = out.get("output_ids")
        if ids_out is None:
            return {"prompt": index, "error": "response has no output_ids"}
        result = {"prompt": index, "output_ids": ids_out, "max_new_tokens": tokens,
                  "meta": {k: meta.get(k) for k in ("completion_tokens", "spec_verify_ct", "spec_accept_length",
                                                    "e2e_latency")}}
        if want_logprobs:
            result["top2"] = [[[row[0], row[1]] for row in (pos or [])[:2]]
                              for pos in meta.get("output_top_logprobs") or []]
        return result

    t = time.time()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(one, jobs))
    return results, time.time() - t


def ramp_tokens(workload: dict, new_tokens: int, i: int, count: int) -> int:
    """Request i's new tokens: all alike, or on a "ramp" workload (i + 1) / count of them, so the
    batch shrinks request by request through every batch size below its concurrency (the way a
    schedule's buckets are crossed between steps)."""
    return max(1, new_tokens * (i + 1) // count) if workload.get("ramp") else new_tokens


def cell_record(server: Server, wname: str, workload: dict, results, wall: float, reference,
                rule: lossless.TieRule) -> dict:
    errors = [r["error"] for r in results if "error" in r]
    ok = [r for r in results if "error" not in r]
    tokens = sum(len(r["output_ids"]) for r in ok)
    cell = {"server": server.spec.name, "workload": wname, "requests": len(results), "errors": errors[:3],
            "error_count": len(errors), "tokens": tokens, "wall_s": round(wall, 2),
            "tok_per_s": round(tokens / wall, 1) if wall > 0 else None,
            "accept_length": lossless.acceptance([r["meta"] for r in ok]) if server.spec.speculative else None}
    if float(workload["temperature"]) == 0.0 and reference is not None:
        divs = lossless.divergences(((r["prompt"], r["output_ids"], r["max_new_tokens"]) for r in ok), reference,
                                    rule)
        cell["divergences"] = [d.as_dict() for d in divs]
        cell["verdict"] = "FAIL" if errors else lossless.verdict(divs)
    else:
        cell["verdict"] = "completed" if not errors and tokens else "FAIL"
    return cell

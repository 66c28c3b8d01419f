"""The emulated step's wait, computed and spun on the device so that CUDA graphs can capture it.

A step's cost splits in two (calibration.Costs): a part fixed by its shape (mode, tokens, batch),
which is static per CUDA graph and so computed on the host once per capture, and attention, which
grows with the batch's sequence lengths and so is computed here from the device tensor that the
graph's replay refills. Nothing here reads a device value back to the host: no .item(), .tolist(),
bool() or int() of a tensor, so a capture records the arithmetic and replays it with new lengths.

The wait is added once per forward, not once per layer: the cost model is per step (its constants
are sums over K2.6's 61 layers, which the proving ground's 3-layer target does not have anyway),
one kernel launch costs the least host time, and spinning after the model keeps the wait off the
target's second CUDA stream (DeepseekV2MoE's shared experts), where a per-layer wait could overlap
with real work and cost less than computed.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from proving_ground.emulator.calibration import Costs


@triton.jit
def _globaltimer():
    # %globaltimer: the GPU's nanosecond clock (PTX ISA); not pure, so every read stays in the loop.
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l", [], dtype=tl.int64, is_pure=False, pack=1)


@triton.jit
def _spin_kernel(duration_ptr, elapsed_ptr):
    duration = tl.load(duration_ptr)
    start = _globaltimer()
    now = start
    while now - start < duration:
        now = _globaltimer()
    tl.store(elapsed_ptr, now - start)


def wait_ns(costs: Costs, mode: str, n_tokens: int, batch: int, seq_lens: torch.Tensor,
            queries: torch.Tensor | None = None, subtract_us: float = 0.0) -> torch.Tensor:
    """[] int64 on seq_lens' device: the step's cost in ns less `subtract_us`, at least 0.

    n_tokens, batch: host ints, the step's shape (per CUDA graph: its padded batch and tokens).
    seq_lens: [batch] int, each request's context. queries: [batch] int, each request's tokens in
    the step (prefill: its extend length); None means n_tokens / batch for every request.
    """
    static_ns = (costs.static_us(mode, n_tokens, batch) - subtract_us) * 1000
    ctx = seq_lens.to(torch.float64)
    if queries is None:
        per_ctx = costs.attn_ns_per_ctx_token + costs.attn_ns_per_query_ctx_token * (n_tokens / batch)
        attn = ctx.sum() * per_ctx
    else:
        attn = (ctx.sum() * costs.attn_ns_per_ctx_token
                + (ctx * queries.to(torch.float64)).sum() * costs.attn_ns_per_query_ctx_token)
    return (attn + static_ns).clamp(min=0).round().to(torch.int64)


def spin(duration_ns: torch.Tensor) -> torch.Tensor:
    """Keep the GPU stream busy for duration_ns ([] int64 on the GPU); [] int64: the ns it spun.

    One program of one warp: the wait occupies the stream, not the GPU's SMs, as a K2.6 step
    occupies the real box's stream. On the CPU there is nothing to spin: returns zeros."""
    elapsed = torch.zeros_like(duration_ns)
    if duration_ns.is_cuda:
        _spin_kernel[(1,)](duration_ns, elapsed, num_warps=1)
    return elapsed


def step_wait(costs: Costs, subtract_us: dict, forward_batch, n_tokens: int) -> torch.Tensor | None:
    """The wait of one SGLang forward: [] int64 ns (spun on the GPU), None for an empty batch.

    forward_batch: SGLang's ForwardBatch (forward_mode, batch_size, seq_lens, extend_seq_lens).
    n_tokens: the forward's token rows (its positions' length: padded to the graph's size)."""
    fm = forward_batch.forward_mode
    batch = forward_batch.batch_size
    if fm.is_idle() or batch < 1 or n_tokens < 1:
        return None
    queries = None
    if fm.is_target_verify():
        mode = "target_verify"
    elif fm.is_decode():
        mode = "decode"
    else:  # extend, mixed and split prefill: each request adds its own extend length
        mode = "extend"
        queries = forward_batch.extend_seq_lens
    duration = wait_ns(costs, mode, n_tokens, batch, forward_batch.seq_lens, queries, subtract_us[mode])
    spin(duration)
    return duration

"""The DDTree flags on SGLang 0.5.17's ServerArgs: their help, the DDTREE spelling, validation, the
token counts per role, the verify-mask policy and the verify's static-memory reserve.

The flags, their defaults and their checks are those of k26_ddtree.sglang.common.args (reused here);
0.5.17 changes where they are declared (one annotated ServerArgs field per flag, the help below)
and how many tokens each role counts:

  speculative_num_draft_tokens   the target's: max(verify width, block). SGLang reads it from the
                                 process-wide spec bag for the decode reservation (committed +
                                 2 N slots per request), the req_to_token row width, the triton
                                 backend's buffers and the draft runner's graphs, so it must hold
                                 both the widest tree and the draft block
  target verify graphs           one runner per verify width of the schedule (budget + 1, a chain
                                 bucket's block), each capturing its buckets' batch sizes with
                                 a triton backend of its own (verify_graphs.py), whose graph
                                 buffers the static-memory reserve counts per runner; the shared
                                 logits buffer holds the widest
  draft graphs                   the block (tokens_per_request: the draft runner's server args are a
                                 copy of the target's, but its graph runner reads the target's N)

Nothing here imports sglang: server_args.py imports this module.
"""

from __future__ import annotations

import logging
import os

from k26_ddtree.sglang.common import args as base
from k26_ddtree.sglang.common.args import DDTreeArgsError, DDTreeSchedule
from k26_ddtree.sglang.v0_5_17 import verify_graphs

logger = logging.getLogger(__name__)

TRITON_BACKEND_CLASS = "TritonAttnBackend"
# cuda_graph_config.decode.backend with no decode graphs (sglang's Backend.DISABLED).
DISABLED_GRAPHS = "disabled"
# The triton backend raises an MLA model's kv splits to the SM count rounded up to a power of two
# (triton_backend._mla_decode_kv_splits_cap, blocks of MLA_MIN_BLOCK_KV tokens); the GPUs served
# have at most 256 SMs, which the static reserve, computed before any GPU is queried, assumes.
MAX_SM_POWER_OF_TWO = 256
MLA_MIN_BLOCK_KV = 32
# Deterministic inference splits the KV into tiles of this many tokens (the env var's default).
DETERMINISTIC_TILE_ENV = "SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE"
DEFAULT_DETERMINISTIC_TILE = 256

HELP_BUDGET = (
    "DFLASH with DDTree: verify a tree of this many draft nodes per request (the budget most probable "
    "draft prefixes) instead of one chain. Turns DDTree on. The target verifies budget + 1 tokens per "
    "request; must be <= sum of topk^d for d = 1..block_size - 1."
)
HELP_TOPK = f"DFLASH with DDTree: candidates per draft position (default {base.DEFAULT_TOPK})."
HELP_SCHEDULE = (
    'DFLASH with DDTree: the tree per batch size instead of one budget, e.g. "1:32/8,4:16/4,16:8/4,64:0": '
    "bs:budget/topk, each bucket from that batch size up to the next, the first at 1; 0 is the plain "
    "DFlash chain. Turns DDTree on; replaces --speculative-ddtree-budget/topk. k26-deploy tune writes one "
    "from a trace."
)
HELP_SPINE = (
    "DFLASH with DDTree: always include the top-1 chain, so acceptance is never below linear DFLASH."
)
HELP_TRACE = (
    "DFLASH with DDTree: append, per decode step and request, the drafter's top-8 tokens and log-probs at "
    "every depth and the tokens the step committed to this file (k26-deploy tune reads it). Default "
    f"${base.TRACE_ENV}, else off."
)
HELP_TRACE_MAX_MB = (
    "DFLASH with DDTree: stop tracing, with a warning, before the trace file passes N MB "
    f"(default {base.DEFAULT_TRACE_MAX_MB})."
)
DEFAULT_TRACE_MAX_MB = base.DEFAULT_TRACE_MAX_MB


def normalize_algorithm(server_args) -> None:
    """First step of ServerArgs.__post_init__: DDTREE -> DFLASH and the flag checks of
    args.normalize_algorithm, after forgetting a count finalize derived (a ServerArgs rebuilt
    from a resolved one resolves the same)."""
    if _derived_draft_tokens(server_args) == server_args.speculative_num_draft_tokens is not None:
        server_args.speculative_num_draft_tokens = None
    base.normalize_algorithm(server_args)


def _derived_draft_tokens(server_args) -> int | None:
    block = server_args.speculative_dflash_block_size
    if block is None or (server_args.speculative_ddtree_budget is None
                         and server_args.speculative_ddtree_budget_schedule is None):
        return None
    return max(base.max_verify_width(server_args), int(block))


def finalize(server_args, attention_backends, page_size) -> None:
    """Last step of SGLang's DFLASH checks (speculative_hook._handle_dflash), once the block size
    is resolved into speculative_num_draft_tokens: validate, then split the counts.
    attention_backends and page_size are the resolving values (the fields may still be unset)."""
    if not base.is_ddtree(server_args):
        return
    block_size = int(server_args.speculative_num_draft_tokens)
    if block_size < 2:
        raise DDTreeArgsError(f"DDTree needs a DFLASH block size >= 2 (one draft position), got {block_size}")
    server_args.speculative_dflash_block_size = block_size
    schedule = DDTreeSchedule.from_server_args(server_args)
    if server_args.speculative_ddtree_budget_schedule is None:
        base.check_tree(schedule.configs[0])
    else:
        base.parse_schedule(server_args.speculative_ddtree_budget_schedule, block_size)
    backends = {b for b in attention_backends if b is not None}
    if backends != {base.SUPPORTED_ATTENTION_BACKEND}:
        raise DDTreeArgsError(
            "DDTree verification needs an attention backend that applies a tree mask: use "
            f"--attention-backend {base.SUPPORTED_ATTENTION_BACKEND} (got {', '.join(sorted(backends)) or 'none'})"
        )
    if page_size not in (None, 1):
        raise DDTreeArgsError(
            f"DDTree keeps the accepted tree path's KV slots, which needs --page-size 1 (got {page_size})"
        )
    base.resolve_trace(server_args, depth=block_size - 1)
    server_args.speculative_num_draft_tokens = max(schedule.max_verify_width, block_size)
    logger.info(
        "DDTree on: %s, spine %s, block %d; the target verifies %d tokens per request.",
        schedule.describe(), bool(server_args.speculative_ddtree_spine), block_size, schedule.max_verify_width,
    )


def tokens_per_request(server_args, is_draft_worker: bool, num_draft_tokens: int) -> int:
    """Tokens per request of a runner's TARGET_VERIFY graphs and logits buffer: with DDTree the
    draft's block, and the target's `num_draft_tokens` where it is one of the schedule's verify
    widths (a width's own runner, verify_graphs.py), else its widest (the spec bag's count, which
    also holds the block); otherwise SGLang's `num_draft_tokens`."""
    if not base.is_ddtree(server_args) or server_args.speculative_dflash_block_size is None:
        return num_draft_tokens
    if is_draft_worker:
        return int(server_args.speculative_dflash_block_size)
    schedule = DDTreeSchedule.from_server_args(server_args)
    if any(bucket.verify_width == num_draft_tokens for bucket in schedule.buckets):
        return num_draft_tokens
    return schedule.max_verify_width


def verify_needs_mask(backend_name: str, upstream: bool, spec) -> bool:
    """Whether a DFlash target verify graph is captured reading the custom mask. SGLang skips it
    for backends whose causal path covers a chain (Triton among them); a DDTree verify is a
    tree, so the Triton graph must read the mask. `spec`: the spec config (its DDTree fields)."""
    if backend_name == TRITON_BACKEND_CLASS and base.is_ddtree(spec):
        return True
    return upstream


def verify_reserved_mem_mb(server_args) -> float:
    """GPU memory (MB) the DDTree verify adds to SGLang's static-memory reserve
    (ServerArgs._handle_gpu_memory_settings, whose graph reserve counts a fixed amount per batch
    size): the verify logits (common.args.verify_logits_bytes) and the target verify runners'
    triton graph buffers (verify_graph_buffer_bytes). 0 without DDTree."""
    if not base.is_ddtree(server_args):
        return 0.0
    model_config = server_args.get_model_config()
    logits = base.verify_logits_bytes(_GraphFields(server_args), vocab_size=model_config.vocab_size)
    return (logits + verify_graph_buffer_bytes(server_args, model_config)) / (1 << 20)


def verify_graph_buffer_bytes(server_args, model_config) -> int:
    """GPU bytes of the triton graph buffers of the target's verify runners (one per verify width
    under a schedule of several, verify_graphs.py, each with its own backend), each at its largest
    batch size, per request: the uint8 verify mask (VerifyMask: width * (context + width), the
    runner's width, or for SGLang's one runner the spec bag's count), kv_indices (an int64
    req_to_token row, common/buffers.py) and one row of the decode-only buffers. SGLang's decode
    graph sizes bound each runner's largest: its capture filters never raise it."""
    decode = server_args.cuda_graph_config.decode
    if decode.backend == DISABLED_GRAPHS:
        return 0
    sizes = decode.bs
    context_len = int(model_config.context_len)
    num_draft_tokens = max(base.max_verify_width(server_args), int(server_args.speculative_dflash_block_size or 0))
    buckets = verify_graphs.width_buckets(server_args)
    if buckets is None:
        runners = {num_draft_tokens: max(sizes)}
    else:
        plan = verify_graphs.runner_batch_sizes(buckets, lambda width: sizes)
        runners = {width: batch_sizes[-1] for width, batch_sizes in plan.items()}
    # req_to_token rows: the context, 4 spare columns and the spec bag's count (kv_cache_configurator).
    kv_indices = 8 * (context_len + 4 + num_draft_tokens)
    decode_row = _decode_row_bytes(server_args, model_config)
    return sum(batch_size * (width * (context_len + width) + kv_indices + decode_row)
               for width, batch_size in runners.items())


def _decode_row_bytes(server_args, model_config) -> int:
    """Bytes of one row of the triton backend's decode-only graph buffers (fp32 attention logits of
    the value dim and, for a hybrid sliding-window model whose window layers differ, of theirs;
    fp32 lse; the int32 split count), with TritonAttnBackend.__init__'s heads per attention rank,
    kv splits and value dim (an MLA model's: kv_lora_rank)."""
    attn_dp_size = server_args.dp_size if server_args.enable_dp_attention else 1
    attn_tp_size = max(1, server_args.tp_size // attn_dp_size // server_args.attn_cp_size)
    heads = model_config.get_max_num_attention_heads() // attn_tp_size * server_args.dcp_size
    context_len = int(model_config.context_len)
    use_mla = model_config.attention_arch.name == "MLA"
    splits = int(server_args.triton_attention_num_kv_splits)
    if use_mla:
        splits = max(splits, min(MAX_SM_POWER_OF_TWO, _next_power_of_2(-(-context_len // MLA_MIN_BLOCK_KV))))
    tile = server_args.triton_attention_split_tile_size
    if server_args.enable_deterministic_inference:
        tile = int(os.environ.get(DETERMINISTIC_TILE_ENV, DEFAULT_DETERMINISTIC_TILE))
    if tile is not None:
        splits = -(-context_len // int(tile))
    value_dims = int(model_config.kv_lora_rank if use_mla else model_config.v_head_dim)
    if model_config.is_hybrid_swa and model_config.swa_v_head_dim != model_config.v_head_dim:
        value_dims += int(model_config.swa_v_head_dim)
    return 4 * heads * splits * (value_dims + 1) + 4


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class _GraphFields:
    """A ServerArgs as the shared accounting reads it: 0.5.17 keeps the decode graphs' backend and
    largest batch size in cuda_graph_config.decode."""

    def __init__(self, server_args):
        decode = server_args.cuda_graph_config.decode
        self.disable_cuda_graph = decode.backend == DISABLED_GRAPHS
        self.cuda_graph_max_bs = decode.max_bs
        self._server_args = server_args

    def __getattr__(self, name):
        return getattr(self._server_args, name)

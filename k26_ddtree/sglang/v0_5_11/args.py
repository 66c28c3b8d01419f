"""The DDTree flags on SGLang 0.5.11's ServerArgs: their declaration, the last validation step, and
the token counts per role.

The flags' meaning, defaults and checks are those of k26_ddtree.sglang.common.args; the patched
0.5.11 files read DDTree's args through this module alone, so the common names they call are
imported here too.

The split that keeps CUDA graphs and attention buffers sized right: after
validation the TARGET's `speculative_num_draft_tokens` is budget + 1 (the tree
nodes verified per request; under a schedule the widest bucket's, and each
bucket's verify CUDA graphs hold its own count, schedule_graphs.py) and
`speculative_dflash_block_size` holds the drafter's block. The draft worker
deep-copies the server args and must put the block back (`apply_to_draft_args`):
its runner, graphs and triton backend size themselves from that copy, and a
budget + 1 leaking into them makes the draft read and write past its 8-token
rows in the shared graph pool.

Per request a decode step claims max(budget + 1, block) token slots and
req_to_token columns (the draft block first, then the tree): the scheduler's
decode-memory check and the req_to_token row width use
`step_slots_per_request`, so every budget >= 1 fits, including those whose
tree is smaller than the block.

Nothing here imports sglang: server_args.py imports this module.
"""

from __future__ import annotations

import logging

# normalize_algorithm is the patched server_args.py's, called through this module.
from k26_ddtree.sglang.common.args import (
    DEFAULT_TOPK,
    DEFAULT_TRACE_MAX_MB,
    SUPPORTED_ATTENTION_BACKEND,
    TRACE_ENV,
    DDTreeArgsError,
    DDTreeSchedule,
    check_tree,
    draft_block_size,
    is_ddtree,
    max_verify_width,
    normalize_algorithm,
    parse_schedule,
    resolve_trace,
    verify_logits_bytes,
)

logger = logging.getLogger(__name__)


def add_cli_args(parser) -> None:
    """The DDTree flags (each needs a ServerArgs field of the same name)."""
    parser.add_argument(
        "--speculative-ddtree-budget",
        type=int,
        default=None,
        help="DFLASH with DDTree: verify a tree of this many draft nodes per request (the budget "
        "most probable draft prefixes) instead of one chain. Turns DDTree on. The target verifies "
        "budget + 1 tokens per request; must be <= sum of topk^d for d = 1..block_size - 1.",
    )
    parser.add_argument(
        "--speculative-ddtree-topk",
        type=int,
        default=None,
        help=f"DFLASH with DDTree: candidates per draft position (default {DEFAULT_TOPK}).",
    )
    parser.add_argument(
        "--speculative-ddtree-budget-schedule",
        type=str,
        default=None,
        metavar="SCHEDULE",
        help="DFLASH with DDTree: the tree per batch size instead of one budget, e.g. "
        '"1:32/8,4:16/4,16:8/4,64:0": bs:budget/topk, each bucket from that batch size up to the next, the '
        "first at 1; 0 is the plain DFlash chain. Turns DDTree on; replaces --speculative-ddtree-budget/topk. "
        "k26-deploy tune writes one from a trace.",
    )
    parser.add_argument(
        "--speculative-ddtree-spine",
        action="store_true",
        default=False,
        help="DFLASH with DDTree: always include the top-1 chain, so acceptance is never below linear DFLASH.",
    )
    parser.add_argument(
        "--speculative-ddtree-trace",
        type=str,
        default=None,
        metavar="PATH",
        help="DFLASH with DDTree: append, per decode step and request, the drafter's top-8 tokens and log-probs "
        f"at every depth and the tokens the step committed to this file (k26-deploy tune reads it). Default "
        f"${TRACE_ENV}, else off.",
    )
    parser.add_argument(
        "--speculative-ddtree-trace-max-mb",
        type=int,
        default=DEFAULT_TRACE_MAX_MB,
        metavar="N",
        help=f"DFLASH with DDTree: stop tracing, with a warning, before the trace file passes N MB "
        f"(default {DEFAULT_TRACE_MAX_MB}).",
    )


def finalize(server_args) -> None:
    """Last step of the DFLASH branch of _handle_speculative_decoding, once the block
    size is resolved into speculative_num_draft_tokens: validate, then split."""
    if not is_ddtree(server_args):
        return
    block_size = int(server_args.speculative_num_draft_tokens)
    if block_size < 2:
        raise DDTreeArgsError(f"DDTree needs a DFLASH block size >= 2 (one draft position), got {block_size}")
    server_args.speculative_dflash_block_size = block_size
    schedule = DDTreeSchedule.from_server_args(server_args)
    if server_args.speculative_ddtree_budget_schedule is None:
        check_tree(schedule.configs[0])
    else:
        parse_schedule(server_args.speculative_ddtree_budget_schedule, block_size)
    backends = {b for b in server_args.get_attention_backends() if b is not None}
    if backends != {SUPPORTED_ATTENTION_BACKEND}:
        raise DDTreeArgsError(
            "DDTree verification needs an attention backend that applies a tree mask: use "
            f"--attention-backend {SUPPORTED_ATTENTION_BACKEND} (got {', '.join(sorted(backends)) or 'none'})"
        )
    if server_args.page_size not in (None, 1):
        raise DDTreeArgsError(
            f"DDTree keeps the accepted tree path's KV slots, which needs --page-size 1 (got {server_args.page_size})"
        )
    resolve_trace(server_args, depth=block_size - 1)
    server_args.speculative_num_draft_tokens = schedule.max_verify_width
    logger.info(
        "DDTree on: %s, spine %s, block %d; the target verifies up to %d tokens per request.",
        schedule.describe(),
        bool(server_args.speculative_ddtree_spine),
        block_size,
        schedule.max_verify_width,
    )


def verify_reserved_mem_mb(server_args, vocab_size: int, context_len: int) -> float:
    """GPU memory (MB) that grows with the budget, for the static-memory estimate: the verify
    logits (common.args.verify_logits_bytes) and the triton backend's uint8 custom-mask graph
    buffer, one context length per verified token of the widest width at the largest batch. Its
    other graph buffers (kv_indices, the decode-only rows) are per request for DFlash runners
    (common/buffers.py), independent of the budget, and not counted."""
    graph_bs = 0 if server_args.disable_cuda_graph else int(server_args.cuda_graph_max_bs or 0)
    mask_bytes = graph_bs * max_verify_width(server_args) * int(context_len)
    return (verify_logits_bytes(server_args, vocab_size) + mask_bytes) / (1 << 20)


def step_slots_per_request(server_args) -> int:
    """The most KV slots (and req_to_token columns past the prefix) one decode step
    claims per request: the verify's speculative_num_draft_tokens, and for DDTree
    also the draft block, whose scratch slots are written into the same row and
    allocated before the verify's (budget + 1 can be smaller than the block)."""
    tokens = int(server_args.speculative_num_draft_tokens)
    if is_ddtree(server_args):
        tokens = max(tokens, draft_block_size(server_args))
    return tokens


def req_to_token_extra(server_args) -> int:
    """Columns each req_to_token row gets past the context length: SGLang's 4, plus
    one decode step's tokens per request when decoding speculatively."""
    if server_args.speculative_num_draft_tokens is None:
        return 4
    return 4 + step_slots_per_request(server_args)


def apply_to_draft_args(draft_server_args) -> None:
    """Give the draft worker's deep-copied args the block size, so its runner, CUDA
    graphs and attention backend are sized for the block, not the tree."""
    if is_ddtree(draft_server_args):
        draft_server_args.speculative_num_draft_tokens = draft_block_size(draft_server_args)


def check_target_runner(model_runner, vocab_size: int, topk: int) -> None:
    """Reject target models whose verify cannot be a tree, once the model is loaded."""
    if getattr(model_runner, "mambaish_config", None) is not None:
        raise DDTreeArgsError(
            "DDTree cannot verify a tree on hybrid Mamba / linear-attention (GDN) models: their "
            "recurrent state follows one token sequence; use linear DFLASH (drop --speculative-ddtree-budget)"
        )
    if topk > vocab_size:
        raise DDTreeArgsError(f"--speculative-ddtree-topk {topk} exceeds the vocabulary size {vocab_size}")

"""The DDTree flags of SGLang's ServerArgs: definition, validation, and the token-count split.

DDTree is a mode of DFLASH, not a new SpeculativeAlgorithm: it is on when
`--speculative-ddtree-budget` is given with `--speculative-algorithm DFLASH`,
or when the algorithm is spelled `DDTREE` (rewritten to DFLASH here, so the
16 `is_dflash()` call sites keep working). Only budget is required;
`--speculative-ddtree-topk` defaults to 4 (the PCIe sweep winner was budget 8,
topk 4) and the DDTREE spelling alone defaults the budget to 8.

The split that keeps CUDA graphs and attention buffers sized right: after
validation the TARGET's `speculative_num_draft_tokens` is budget + 1 (the tree
nodes verified per request) and `speculative_dflash_block_size` holds the
drafter's block. The draft worker deep-copies the server args and must put the
block back (`apply_to_draft_args`): its runner, graphs and triton backend
size themselves from that copy, and a budget + 1 leaking into them makes the
draft read and write past its 8-token rows in the shared graph pool.

Per request a decode step claims max(budget + 1, block) token slots and
req_to_token columns (the draft block first, then the tree): the scheduler's
decode-memory check and the req_to_token row width use
`tokens_per_request_step`, so every budget >= 1 fits, including those whose
tree is smaller than the block.

The server trace (`--speculative-ddtree-trace PATH`, or K26_DDTREE_TRACE when
the flag is not given; trace.py) is validated here too, at parse time, so a bad
path fails the launch in one line before any weights load.

Nothing here imports sglang: server_args.py imports this module.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from k26_ddtree.core.budget import codes_fit, max_budget
from k26_ddtree.sglang.trace import TraceError, check_appendable

logger = logging.getLogger(__name__)

ALGORITHM_SPELLING = "DDTREE"
DEFAULT_TOPK = 4
DEFAULT_BUDGET = 8
SUPPORTED_ATTENTION_BACKEND = "triton"
TRACE_ENV = "K26_DDTREE_TRACE"
DEFAULT_TRACE_MAX_MB = 1024


class DDTreeArgsError(ValueError):
    """A DDTree flag combination SGLang cannot serve; the message says which flag to change."""


@dataclass(frozen=True)
class DDTreeConfig:
    """The resolved DDTree settings of one server.

    budget      draft nodes per tree (the root is extra)
    topk        candidates per draft position
    spine       always keep the top-1 chain
    block_size  the drafter's block; draft positions = block_size - 1
    """

    budget: int
    topk: int
    spine: bool
    block_size: int

    @classmethod
    def from_server_args(cls, server_args) -> DDTreeConfig | None:
        """The config of a validated ServerArgs, or None when DDTree is off."""
        if not is_ddtree(server_args):
            return None
        return cls(
            budget=int(server_args.speculative_ddtree_budget),
            topk=int(server_args.speculative_ddtree_topk),
            spine=bool(server_args.speculative_ddtree_spine),
            block_size=int(server_args.speculative_dflash_block_size),
        )


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


def is_ddtree(server_args) -> bool:
    return (
        server_args.speculative_algorithm == ALGORITHM_SPELLING
        or server_args.speculative_ddtree_budget is not None
    )


def normalize_algorithm(server_args) -> None:
    """First step of ServerArgs.__post_init__: DDTREE -> DFLASH + defaults, before any
    handler compares the algorithm string. Idempotent: a ServerArgs rebuilt from a
    resolved one (speculative_num_draft_tokens already budget + 1) resolves the same."""
    if server_args.speculative_algorithm == ALGORITHM_SPELLING:
        server_args.speculative_algorithm = "DFLASH"
        if server_args.speculative_ddtree_budget is None:
            server_args.speculative_ddtree_budget = DEFAULT_BUDGET
            logger.info("--speculative-algorithm DDTREE without a budget: using budget %d.", DEFAULT_BUDGET)

    budget = server_args.speculative_ddtree_budget
    if budget is None:
        if server_args.speculative_ddtree_topk is not None or server_args.speculative_ddtree_spine:
            raise DDTreeArgsError(
                "--speculative-ddtree-topk and --speculative-ddtree-spine need --speculative-ddtree-budget "
                "(DDTree is on only when a budget is given)"
            )
        if server_args.speculative_ddtree_trace is not None:
            raise DDTreeArgsError(
                "--speculative-ddtree-trace needs DDTree on (--speculative-ddtree-budget, or "
                "--speculative-algorithm DDTREE)"
            )
        return

    if server_args.speculative_algorithm != "DFLASH":
        raise DDTreeArgsError(
            "--speculative-ddtree-budget needs --speculative-algorithm DFLASH (or DDTREE), "
            f"got {server_args.speculative_algorithm!r}"
        )
    if server_args.speculative_ddtree_topk is None:
        server_args.speculative_ddtree_topk = DEFAULT_TOPK
    if int(budget) < 1:
        raise DDTreeArgsError(f"--speculative-ddtree-budget must be >= 1, got {budget}")
    if int(server_args.speculative_ddtree_topk) < 1:
        raise DDTreeArgsError(f"--speculative-ddtree-topk must be >= 1, got {server_args.speculative_ddtree_topk}")

    # With DDTree the target's draft-token count is derived (budget + 1); the block
    # size comes from --speculative-dflash-block-size or the draft config.
    num_draft_tokens = server_args.speculative_num_draft_tokens
    if num_draft_tokens is not None:
        if int(num_draft_tokens) != int(budget) + 1:
            raise DDTreeArgsError(
                f"with DDTree, --speculative-num-draft-tokens is budget + 1 = {int(budget) + 1} "
                f"(got {num_draft_tokens}); set the drafter's block with --speculative-dflash-block-size"
            )
        server_args.speculative_num_draft_tokens = None


def finalize(server_args) -> None:
    """Last step of the DFLASH branch of _handle_speculative_decoding, once the block
    size is resolved into speculative_num_draft_tokens: validate, then split."""
    if not is_ddtree(server_args):
        return
    block_size = int(server_args.speculative_num_draft_tokens)
    budget = int(server_args.speculative_ddtree_budget)
    topk = int(server_args.speculative_ddtree_topk)
    if block_size < 2:
        raise DDTreeArgsError(f"DDTree needs a DFLASH block size >= 2 (one draft position), got {block_size}")
    limit = max_budget(block_size - 1, topk)
    if budget > limit:
        raise DDTreeArgsError(
            f"--speculative-ddtree-budget {budget} is larger than the {limit} distinct draft prefixes "
            f"of topk {topk} over {block_size - 1} draft positions (block size {block_size}); "
            "lower the budget or raise --speculative-ddtree-topk"
        )
    if not codes_fit(block_size - 1, topk, budget):
        raise DDTreeArgsError(
            f"--speculative-ddtree-topk {topk} is too wide for a tree of {min(block_size - 1, budget)} levels "
            "(the tree builder needs max(topk, 2)^min(block size - 1, budget) <= 2^30); "
            "lower the topk or the budget"
        )
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
    server_args.speculative_dflash_block_size = block_size
    server_args.speculative_num_draft_tokens = budget + 1
    logger.info(
        "DDTree on: budget %d, topk %d, spine %s, block %d; the target verifies %d tokens per request.",
        budget,
        topk,
        bool(server_args.speculative_ddtree_spine),
        block_size,
        budget + 1,
    )


def resolve_trace(server_args, depth: int) -> None:
    """The trace path, from the flag or else TRACE_ENV, made absolute (the scheduler processes and
    the log then name one file); refused when a server drafting `depth` positions cannot append to it."""
    max_mb = server_args.speculative_ddtree_trace_max_mb
    if int(max_mb) < 1:
        raise DDTreeArgsError(f"--speculative-ddtree-trace-max-mb must be >= 1, got {max_mb}")
    source, path = "--speculative-ddtree-trace", server_args.speculative_ddtree_trace
    if path is None:
        source, path = TRACE_ENV, os.environ.get(TRACE_ENV) or None
    if path is None:
        return
    path = os.path.abspath(path)
    try:
        check_appendable(path, depth)
    except TraceError as err:
        raise DDTreeArgsError(f"{source}: {err}") from None
    server_args.speculative_ddtree_trace = path


def draft_block_size(server_args) -> int:
    """The drafter's block: speculative_num_draft_tokens for linear DFLASH, the split-off
    block for DDTree."""
    if is_ddtree(server_args):
        return int(server_args.speculative_dflash_block_size)
    return int(server_args.speculative_num_draft_tokens)


def tokens_per_request_step(server_args) -> int:
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
    return 4 + tokens_per_request_step(server_args)


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


def verify_reserved_mem_mb(server_args, vocab_size: int, context_len: int) -> float:
    """GPU memory (MB) that grows with the budget, for the static-memory estimate.

    Per verified token: fp32 logits in the target's graph output and in eager
    verify (logits, scaled logits, target probs and the zeroed draft probs of the
    sampling kernel), plus the triton backend's uint8 custom-mask graph buffer,
    one context length per token (its other graph buffers are per request for
    DFlash runners, see buffers.py).
    """
    num_nodes = int(server_args.speculative_ddtree_budget) + 1
    graph_bs = 0 if server_args.disable_cuda_graph else int(server_args.cuda_graph_max_bs or 0)
    running = int(server_args.max_running_requests or 48)
    logits_row = 4 * int(vocab_size)
    graph_bytes = graph_bs * num_nodes * (logits_row + int(context_len))
    eager_bytes = running * num_nodes * logits_row * 4
    return (graph_bytes + eager_bytes) / (1 << 20)

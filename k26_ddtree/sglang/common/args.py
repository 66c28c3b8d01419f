"""The DDTree flags of SGLang's ServerArgs as every version reads them: their meaning, defaults and
checks, the resolved config and schedule.

DDTree is a mode of DFLASH, not a new SpeculativeAlgorithm: it is on when
`--speculative-ddtree-budget` is given with `--speculative-algorithm DFLASH`,
or when the algorithm is spelled `DDTREE` (rewritten to DFLASH here, so the
16 `is_dflash()` call sites keep working). Only budget is required;
`--speculative-ddtree-topk` defaults to 4 (the PCIe sweep winner was budget 8,
topk 4) and the DDTREE spelling alone defaults the budget to 8.

A schedule (`--speculative-ddtree-budget-schedule "1:32/8,4:16/4,16:8/4,64:0"`)
replaces the one budget/topk: each bucket applies from its batch size up to the
next, `0` is the plain DFlash chain (DFlash's own argmax draft and verify, none
of DDTree's work). The target then verifies up to the largest bucket's verify
width (max_verify_width), which sizes the KV reservation, the req_to_token rows
and the triton backend. DDTreeSchedule is the resolved form; a plain budget is
a schedule of one bucket.

The server trace (`--speculative-ddtree-trace PATH`, or K26_DDTREE_TRACE when
the flag is not given; trace.py) is validated here too, at parse time, so a bad
path fails the launch in one line before any weights load.

Where each version declares the flags, finishes the validation and splits the
token counts between target and draft: v0_5_11/args.py, v0_5_17/args.py.

Nothing here imports sglang: the patched server_args.py imports this module.
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
from dataclasses import dataclass

from k26_ddtree.core import schedule as schedule_text
from k26_ddtree.core.budget import tree_problem
from k26_ddtree.sglang.common.trace import TraceError, check_appendable

logger = logging.getLogger(__name__)

ALGORITHM_SPELLING = "DDTREE"
DEFAULT_TOPK = 4
DEFAULT_BUDGET = 8
SUPPORTED_ATTENTION_BACKEND = "triton"
TRACE_ENV = "K26_DDTREE_TRACE"
# Test-only: "module:factory" of a top-K rewrite (draft.topk_hook_from_env), loaded by dotted
# path so that the serving package never imports the code that provides one; unset in service.
TOPK_HOOK_ENV = "K26_DDTREE_TOPK_HOOK"
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

    @property
    def verify_width(self) -> int:
        """Tokens the target verifies per request: the tree's budget nodes and its root."""
        return self.budget + 1


@dataclass(frozen=True)
class ScheduleBucket:
    """From batch size `min_bs` up to the next bucket's: this DDTree config, or (config None)
    the plain DFlash chain of `block_size` tokens."""

    min_bs: int
    config: DDTreeConfig | None
    block_size: int

    @property
    def verify_width(self) -> int:
        return self.block_size if self.config is None else self.config.verify_width


@dataclass(frozen=True)
class DDTreeSchedule:
    """The DDTree settings of one server, per batch-size bucket (one bucket without a schedule).

    buckets     sorted by min_bs, the first from batch size 1
    """

    buckets: tuple[ScheduleBucket, ...]

    @classmethod
    def from_server_args(cls, server_args) -> DDTreeSchedule | None:
        """The schedule of a validated ServerArgs, or None when DDTree is off."""
        if not is_ddtree(server_args):
            return None
        block = int(server_args.speculative_dflash_block_size)
        spine = bool(server_args.speculative_ddtree_spine)
        text = server_args.speculative_ddtree_budget_schedule
        entries = parse_schedule(text) if text is not None else [
            schedule_text.Entry(1, int(server_args.speculative_ddtree_budget), int(server_args.speculative_ddtree_topk))
        ]
        return cls(tuple(
            ScheduleBucket(e.min_bs, None if e.chain else DDTreeConfig(e.budget, e.topk, spine, block), block)
            for e in entries
        ))

    def describe(self) -> str:
        """One line for the log: each bucket's batch sizes and what serves them."""
        parts = []
        for bucket, end in zip(self.buckets, [b.min_bs - 1 for b in self.buckets[1:]] + [None]):
            sizes = f"bs {bucket.min_bs}+" if end is None else f"bs {bucket.min_bs}-{end}"
            what = "DFlash chain" if bucket.config is None else (
                f"budget {bucket.config.budget} topk {bucket.config.topk} spine {bucket.config.spine}")
            parts.append(f"{sizes}: {what}")
        return "; ".join(parts)

    @property
    def configs(self) -> list[DDTreeConfig]:
        return [b.config for b in self.buckets if b.config is not None]

    @property
    def max_verify_width(self) -> int:
        return max(b.verify_width for b in self.buckets)

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [b.min_bs for b in self.buckets]

    def index(self, batch_size: int) -> int:
        """The bucket serving a batch of this size (a batch of 0, an idle one, is the first's);
        asked every decode step."""
        return bisect.bisect_right(self._starts, max(batch_size, 1)) - 1

    def graph_batch_sizes(self, sizes) -> list[list[int]]:
        """bucket_graph_batch_sizes of these buckets."""
        return bucket_graph_batch_sizes(self._starts, sizes)


def bucket_graph_batch_sizes(starts: list[int], sizes) -> list[list[int]]:
    """Per bucket (`starts`: each one's first batch size, ascending from 1), the CUDA-graph batch
    sizes it captures from the server's `sizes`, plus the last batch size of every bucket that some
    larger captured size follows: a batch is padded up to the next captured size, and that size
    must lie in the batch's own bucket, whose verify width its graph holds."""
    sizes = sorted({int(s) for s in sizes if int(s) > 0})
    if not sizes:
        return [[] for _ in starts]
    ends = [start - 1 for start in starts[1:] if start - 1 < sizes[-1]]
    per_bucket: list[list[int]] = [[] for _ in starts]
    for size in sorted(set(sizes) | set(ends)):
        per_bucket[bisect.bisect_right(starts, size) - 1].append(size)
    return per_bucket


def is_ddtree(server_args) -> bool:
    return (
        server_args.speculative_algorithm == ALGORITHM_SPELLING
        or server_args.speculative_ddtree_budget is not None
        or server_args.speculative_ddtree_budget_schedule is not None
    )


def parse_schedule(text: str, block_size: int | None = None) -> list[schedule_text.Entry]:
    """The schedule flag's buckets (core.schedule.parse; with the block size known, also checked
    as served), its problems as this flag's errors."""
    try:
        return schedule_text.parse(text) if block_size is None else schedule_text.parse_checked(text, block_size)
    except schedule_text.ScheduleError as err:
        raise DDTreeArgsError(f"--speculative-ddtree-budget-schedule: {err}") from None


def normalize_algorithm(server_args) -> None:
    """First step of ServerArgs.__post_init__: DDTREE -> DFLASH + defaults, before any
    handler compares the algorithm string. Idempotent: a ServerArgs rebuilt from a
    resolved one (speculative_num_draft_tokens already budget + 1) resolves the same."""
    if server_args.speculative_algorithm == ALGORITHM_SPELLING:
        server_args.speculative_algorithm = "DFLASH"
        if server_args.speculative_ddtree_budget is None and server_args.speculative_ddtree_budget_schedule is None:
            server_args.speculative_ddtree_budget = DEFAULT_BUDGET
            logger.info("--speculative-algorithm DDTREE without a budget: using budget %d.", DEFAULT_BUDGET)

    if server_args.speculative_ddtree_budget_schedule is not None:
        _normalize_schedule(server_args)
        return
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

    _check_dflash(server_args, "--speculative-ddtree-budget")
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


def _normalize_schedule(server_args) -> None:
    if server_args.speculative_ddtree_budget is not None or server_args.speculative_ddtree_topk is not None:
        raise DDTreeArgsError(
            "--speculative-ddtree-budget-schedule replaces --speculative-ddtree-budget and "
            "--speculative-ddtree-topk: give the schedule alone"
        )
    _check_dflash(server_args, "--speculative-ddtree-budget-schedule")
    parse_schedule(server_args.speculative_ddtree_budget_schedule)
    num_draft_tokens = server_args.speculative_num_draft_tokens
    if num_draft_tokens is None:
        return
    # A ServerArgs rebuilt from a resolved one carries the derived count; anything else is the user's.
    if server_args.speculative_dflash_block_size is None or int(num_draft_tokens) != max_verify_width(server_args):
        raise DDTreeArgsError(
            "with a DDTree schedule the target's --speculative-num-draft-tokens is derived from it; "
            "set the drafter's block with --speculative-dflash-block-size"
        )
    server_args.speculative_num_draft_tokens = None


def _check_dflash(server_args, flag: str) -> None:
    if server_args.speculative_algorithm != "DFLASH":
        raise DDTreeArgsError(
            f"{flag} needs --speculative-algorithm DFLASH (or DDTREE), got {server_args.speculative_algorithm!r}"
        )


def check_tree(config: DDTreeConfig) -> None:
    """A budget and topk (their flags) the tree builder can serve at this block size."""
    problem = tree_problem(config.block_size - 1, config.topk, config.budget)
    if problem is not None:
        setting, why = problem
        raise DDTreeArgsError(f"--speculative-ddtree-{setting} {why}")


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


def bucket_verify_widths(server_args) -> list[tuple[int, int]]:
    """(first batch size, verify width) of each bucket, also before finalize resolves the block
    size (the static-memory reserve is computed first): a tree's budget + 1, a chain's block where
    --speculative-dflash-block-size gives it (the draft config's is read later; k26-deploy's units
    always give it), else 1."""
    text = server_args.speculative_ddtree_budget_schedule
    if text is None:
        return [(1, int(server_args.speculative_ddtree_budget) + 1)]
    block = server_args.speculative_dflash_block_size
    return [(entry.min_bs, int(block) if entry.chain and block is not None else entry.budget + 1)
            for entry in parse_schedule(text)]


def max_verify_width(server_args) -> int:
    """The most tokens a bucket verifies per request (bucket_verify_widths)."""
    return max(width for _, width in bucket_verify_widths(server_args))


def verify_logits_bytes(server_args, vocab_size: int) -> int:
    """GPU bytes of the verify's fp32 logits, per verified token of the widest width: the target
    graphs' output buffer (largest batch) and eager verify (logits, scaled logits, target probs
    and the zeroed draft probs of the sampling kernel, every running request)."""
    graph_bs = 0 if server_args.disable_cuda_graph else int(server_args.cuda_graph_max_bs or 0)
    running = int(server_args.max_running_requests or 48)
    return (graph_bs + 4 * running) * max_verify_width(server_args) * 4 * int(vocab_size)

"""The draft half of a DDTree decode step: the block's top-K log-probs, then the tree.

DFlash's one block forward is unchanged; where DFlash takes the argmax of the
target lm_head on the draft hidden states, DDTree needs the top-K tokens and
their log-softmax over the WHOLE vocabulary. With tensor parallelism the
lm_head is vocab-sharded, so every rank computes logits for its shard only:
per-shard top-K and per-shard log-sum-exp, one all_gather of the three small
tensors, then a global top-K over tp * K candidates and a global log-sum-exp.
The global top-K is among the per-shard top-Ks (a token in the global top-K
beats every other token of its own shard), so the merge is exact.

The logits are the plain hidden @ weight.T the DFlash argmax uses (no logit
scaling or soft-capping): the log-probs only rank the tree's prefixes, the
target's verification decides what is committed.

DDTreeDrafter.draft is what the worker calls. On one rank with no top-K hook
the whole draft piece (lm_head, top-K, tree, mask, positions) replays from one
CUDA graph (step_graphs); under TP the top-K and its all_gather run eagerly
and the graph starts from the merged top-K.

While the server traces (trace.py) the top-K is computed eagerly with
K = max(8, topk) on every rank, so the record gets the top-8 whatever the served
topk; the tree takes the first topk of them through the same top-K graph path.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from k26_ddtree.sglang.common.args import TOPK_HOOK_ENV, DDTreeConfig, DDTreeSchedule
from k26_ddtree.sglang.common.step_graphs import StepGraphs, StepTree
from k26_ddtree.sglang.common.trace import TOPK as TRACE_TOPK
from k26_ddtree.sglang.common.trace import StepDraft, TraceWriter

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.server_args import ServerArgs

ROWS_PER_CHUNK = 256


TopKHook = Callable[[list, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor]"]


@dataclass(frozen=True)
class DraftHead:
    """This rank's vocab shard of the target lm_head, as the drafter reads it.

    weight      [local vocab (padded), H]: base vocab rows [0, num_org), added
                vocab rows [num_org_padded, num_org_padded + num_added); held from start-up
                (and read by the one-rank draft graph), so a weight update must write into
                this tensor, as SGLang's loaders do, not replace it
    tp_group    SGLang's GroupCoordinator (world_size, all_gather_into_tensor);
                None or world_size 1: this shard is the whole vocabulary
    """

    weight: torch.Tensor
    num_org: int
    org_start: int
    num_org_padded: int
    num_added: int
    added_start: int
    tp_group: object = None

    @classmethod
    def of(cls, lm_head, tp_group=None) -> DraftHead:
        shard = lm_head.shard_indices
        return cls(
            weight=lm_head.weight,
            num_org=int(shard.num_org_elements),
            org_start=int(shard.org_vocab_start_index),
            num_org_padded=int(shard.num_org_elements_padded),
            num_added=int(shard.num_added_elements),
            added_start=int(shard.added_vocab_start_index),
            tp_group=tp_group,
        )

    @property
    def tp_size(self) -> int:
        return 1 if self.tp_group is None else int(self.tp_group.world_size)

    def shard_logits(self, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(logits [M, n] float32, global token id of each column [n]) of this shard; the ids
        are None when the columns are the base vocab alone (no id table to build per step)."""
        hs = hidden if hidden.dtype == self.weight.dtype else hidden.to(self.weight.dtype)
        logits = torch.matmul(hs, self.weight[: self.num_org].T).float()
        if self.num_added == 0:
            return logits, None
        # Added (e.g. LoRA) vocab sits after the padded base vocab in the local weight.
        start = self.num_org_padded
        added = torch.matmul(hs, self.weight[start : start + self.num_added].T).float()
        ids = torch.cat(
            [
                torch.arange(self.num_org, device=hidden.device) + self.org_start,
                torch.arange(self.num_added, device=hidden.device) + self.added_start,
            ]
        )
        return torch.cat([logits, added], dim=1), ids

    def topk_per_depth(self, hidden: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """topk_logprobs of the draft block's hidden states [B, D, H]: ([B, D, K], [B, D, K])."""
        batch, depth, hidden_size = hidden.shape
        tokens, logprobs = self.topk_logprobs(hidden.reshape(-1, hidden_size), topk)
        return tokens.view(batch, depth, topk), logprobs.view(batch, depth, topk)

    def topk_logprobs(self, hidden: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(token ids [M, K] long, log-probs [M, K] float32, descending along K) for hidden [M, H],
        over the whole vocabulary. One rank: a fixed sequence of ops (CUDA-graph capturable)."""
        values, token_ids, lse = shard_topk(hidden, self, topk)
        if self.tp_size == 1:
            # One shard is the whole vocabulary: its top-K, already descending, is the answer.
            return token_ids, (values - lse.unsqueeze(1)).clamp(max=0.0)
        tp, rows = self.tp_size, hidden.shape[0]
        gathered_values = values.new_empty((tp * rows, topk))
        gathered_ids = token_ids.new_empty((tp * rows, topk))
        gathered_lse = lse.new_empty((tp * rows,))
        self.tp_group.all_gather_into_tensor(gathered_values, values.contiguous())
        self.tp_group.all_gather_into_tensor(gathered_ids, token_ids.contiguous())
        self.tp_group.all_gather_into_tensor(gathered_lse, lse.contiguous())
        return merge_shards(
            gathered_values.view(tp, rows, topk),
            gathered_ids.view(tp, rows, topk),
            gathered_lse.view(tp, rows),
            topk,
        )


def _chunk_topk(hidden: torch.Tensor, head: DraftHead, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, column_ids = head.shard_logits(hidden)
    k = min(topk, logits.shape[1])
    top = logits.topk(k, dim=1)
    token_ids = top.indices + head.org_start if column_ids is None else column_ids[top.indices]
    values = top.values
    if k < topk:
        values = F.pad(values, (0, topk - k), value=float("-inf"))
        token_ids = F.pad(token_ids, (0, topk - k), value=0)
    return values, token_ids, torch.logsumexp(logits, dim=1)


def shard_topk(hidden: torch.Tensor, head: DraftHead, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part: (values [M, K] f32, token ids [M, K] long, log-sum-exp [M] f32).

    A shard with fewer than K tokens pads with -inf values, which never win the merge.
    Rows go through the lm_head in chunks of ROWS_PER_CHUNK to bound the fp32 logits.
    """
    rows = hidden.shape[0]
    if rows <= ROWS_PER_CHUNK:
        return _chunk_topk(hidden, head, topk)
    parts = [_chunk_topk(hidden[start : start + ROWS_PER_CHUNK], head, topk) for start in range(0, rows, ROWS_PER_CHUNK)]
    return tuple(torch.cat(columns, dim=0) for columns in zip(*parts))


def merge_shards(
    values: torch.Tensor, token_ids: torch.Tensor, lse: torch.Tensor, topk: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Global (token ids [M, K] long, log-probs [M, K] f32, descending) from the
    gathered per-shard parts: values/token_ids [tp, M, K], lse [tp, M]."""
    tp, rows, k = values.shape
    candidates = values.permute(1, 0, 2).reshape(rows, tp * k)
    candidate_ids = token_ids.permute(1, 0, 2).reshape(rows, tp * k)
    top = candidates.topk(topk, dim=1)
    total_lse = torch.logsumexp(lse, dim=0)
    # log-sum-exp >= max, so this is <= 0 up to rounding; the tree builder's
    # integer keys need it non-positive.
    logprobs = (top.values - total_lse.unsqueeze(1)).clamp(max=0.0)
    return candidate_ids.gather(1, top.indices), logprobs


def topk_hook_from_env() -> TopKHook | None:
    """The test-only top-K rewrite that TOPK_HOOK_ENV names as "module:factory", else None.

    factory() returns the hook. A value that names no callable stops the server at start-up:
    a test that asked for a hook must not run silently without it."""
    spec = os.environ.get(TOPK_HOOK_ENV)
    if not spec:
        return None
    module, sep, name = spec.partition(":")
    factory = getattr(importlib.import_module(module), name, None) if sep and module and name else None
    if not callable(factory):
        raise ValueError(f"{TOPK_HOOK_ENV}={spec!r} names no callable; give MODULE:FACTORY")
    return factory()


class DDTreeDrafter:
    """The draft half of a worker's DDTree step: its config, lm_head shard, step graphs and hook.

    trace_topk  while tracing, the top-K computed per draft position (>= 8 and >= config.topk;
                the same on every TP rank, as the all_gather needs); None when not tracing
    trace       the trace's writer, on TP rank 0 only; None on the other ranks and when not tracing
    """

    def __init__(self, config: DDTreeConfig, head: DraftHead, graphs: StepGraphs, topk_hook: TopKHook | None = None,
                 trace_topk: int | None = None, trace: TraceWriter | None = None):
        self.config = config
        self.head = head
        self.graphs = graphs
        self.topk_hook = topk_hook
        self.trace_topk = trace_topk
        self.trace = trace

    @classmethod
    def for_bucket(cls, config: DDTreeConfig, head: DraftHead, batch_sizes: list[int], server_args: ServerArgs,
                   device: torch.device | str, hook: TopKHook | None, trace: TraceWriter | None) -> DDTreeDrafter:
        """One schedule bucket's drafter, its step graphs captured now (at worker start-up) for
        `batch_sizes`, none in a step."""
        traced = server_args.speculative_ddtree_trace is not None
        # The graph can own the top-K only where it needs no collective, nothing rewrites it and
        # the trace needs no wider top-K than the tree's.
        graph_head = head if head.tp_size == 1 and hook is None and not traced else None
        graphs = StepGraphs(config, batch_sizes, graph_head, device, max_batch=server_args.max_running_requests)
        graphs.capture()
        if not traced:
            return cls(config, head, graphs, hook)
        return cls(config, head, graphs, hook, max(TRACE_TOPK, config.topk), trace)

    def draft(self, verified_id: torch.Tensor, draft_hidden: torch.Tensor, batch: ScheduleBatch) -> StepTree:
        """This step's tree, ancestor mask and positions.

        verified_id   [B] the last committed token, the root of every tree
        draft_hidden  [B, block_size, H] the draft block's hidden states; position 0 is the root's
        batch         the ScheduleBatch: seq_lens [B] (the root sits at position seq_len), and
                      reqs for the top-K hook
        """
        hidden = draft_hidden[:, 1:, :]
        if self.trace_topk is not None:
            return self._traced_draft(verified_id, hidden, batch)
        if self.graphs.owns_topk:
            return self.graphs.draft_from_hidden(verified_id, hidden, batch.seq_lens)
        return self._tree(verified_id, *self.head.topk_per_depth(hidden, self.config.topk), batch)

    def _traced_draft(self, verified_id: torch.Tensor, hidden: torch.Tensor, batch: ScheduleBatch) -> StepTree:
        tokens, logprobs = self.head.topk_per_depth(hidden, self.trace_topk)
        traced = None if self.trace is None else StepDraft.of(self.trace, verified_id, tokens, logprobs)
        topk = self.config.topk
        step = self._tree(verified_id, tokens[..., :topk], logprobs[..., :topk], batch)
        step.trace = traced
        return step

    def _tree(self, verified_id: torch.Tensor, tokens: torch.Tensor, logprobs: torch.Tensor,
              batch: ScheduleBatch) -> StepTree:
        if self.topk_hook is not None:
            tokens, logprobs = self.topk_hook(batch.reqs, tokens, logprobs)
        return self.graphs.draft(verified_id, tokens, logprobs, batch.seq_lens)


class DDTreeDrafters:
    """One worker's drafters: per bucket of its schedule, a DDTreeDrafter, or None for the
    plain DFlash chain (the worker's own argmax draft).

    topk_hook   the test-only top-K rewrite every drafter applies, or None
    """

    def __init__(self, schedule: DDTreeSchedule, drafters: list[DDTreeDrafter | None], topk_hook: TopKHook | None):
        self.schedule = schedule
        self.drafters = drafters
        self.topk_hook = topk_hook

    @classmethod
    def for_worker(cls, schedule: DDTreeSchedule, server_args: ServerArgs, lm_head, tp_group,
                   device: torch.device | str, tp_rank: int) -> DDTreeDrafters:
        """Built at worker start-up; TP rank 0 opens the trace file when the server traces
        (one writer for every bucket)."""
        head = DraftHead.of(lm_head, tp_group)
        hook = topk_hook_from_env()
        traced = server_args.speculative_ddtree_trace is not None
        trace = TraceWriter.for_server(server_args) if traced and tp_rank == 0 else None
        sizes = schedule.graph_batch_sizes(StepGraphs.server_batch_sizes(server_args, device))
        drafters = [
            None if bucket.config is None
            else DDTreeDrafter.for_bucket(bucket.config, head, bucket_sizes, server_args, device, hook, trace)
            for bucket, bucket_sizes in zip(schedule.buckets, sizes)
        ]
        return cls(schedule, drafters, hook)

    def for_batch(self, batch_size: int) -> DDTreeDrafter | None:
        """The drafter of the bucket serving a batch of this size; None: the DFlash chain."""
        return self.drafters[self.schedule.index(batch_size)]

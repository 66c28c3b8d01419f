"""The DDTree verify step inside SGLang 0.5.11: prepare the tree forward, then accept, record, commit.

DDTreeVerifyInput is a DFlashVerifyInput (so every `isinstance` check, the
SpecInputType and the attention backends treat it as DFlash's verify input)
whose tokens are the budget + 1 nodes of a DDTree per request instead of a
block. Its verify reads top-down:

  accept              greedy: the walk over the target's argmax (in the step's verify
                      CUDA graph where there is one); sampling: sgl_kernel's tree
                      sampling kernel (exact), or the torch walk without it
                      -> PackedAcceptance, one [B, 2 * (D + 1) + 1] tensor
  record_on_requests  on the host, from its one device -> host copy: output ids,
                      finish and grammar checks, spec metrics, KV lengths
  commit_on_device    one host -> device copy of the commit lengths and new roots,
                      then the accepted paths' KV slots to req_to_token in depth
                      order (the rest freed) and the path nodes' hidden states as
                      the next draft context (verify_utils.commit_path)
  trace_step          only while the server traces: the step's records (drafter
                      top-8, committed tokens) of its greedy requests to the trace writer

Everything returned is a fresh tensor (index copies), never a view into the
CUDA-graph output buffers (the target's and step_graphs'), which the next
replay overwrites.

Host syncs per step: that one device -> host copy, which DFlash's verify also
makes; no boolean-mask indexing (a nonzero sync each) anywhere. Sampling adds
what DFlash's sampling adds (the largest top-k, read on the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Tuple

import torch

from k26_ddtree.core.tree import DDTree
from k26_ddtree.core.verify import PackedAcceptance, verify_sampling
from k26_ddtree.sglang.common.step_graphs import StepTree
from k26_ddtree.sglang.common.trace import StepDraft
from k26_ddtree.sglang.common.verify_utils import (
    apply_logit_adjustments,
    assign_node_slots,
    commit_path,
    kernel_sampling,
    target_probs,
    verify_custom_mask,
)
from sglang.srt.mem_cache.common import alloc_token_slots
from sglang.srt.speculative import dflash_utils
from sglang.srt.speculative.dflash_info import DFlashVerifyInput

if TYPE_CHECKING:
    from sglang.srt.layers.logits_processor import LogitsProcessorOutput
    from sglang.srt.managers.schedule_batch import Req, ScheduleBatch


@dataclass
class HostCommit:
    """Per request, what the host decided to commit (accepted drafts + bonus, cut at a finish).

    commit_lens   committed tokens (>= 1)
    new_verified  the last committed token: the next step's root
    accepted      accepted draft tokens (commit_len - 1)
    """

    commit_lens: List[int]
    new_verified: List[int]
    accepted: List[int]


@dataclass
class DeviceCommit:
    """DFlash's verify outputs: new_verified_id [B] long, commit_lens [B] int32,
    next_hidden [sum(commit_lens), F] (the next draft's context)."""

    new_verified_id: torch.Tensor
    commit_lens: torch.Tensor
    next_hidden: torch.Tensor


def record_on_requests(reqs: List[Req], committed: List[List[int]]) -> HostCommit:
    """Append each request's committed tokens as DFlash does (stopping at a finish, feeding
    the grammar), and count the step in its spec metrics and KV lengths."""
    host = HostCommit([], [], [])
    for req, tokens in zip(reqs, committed):
        appended = 0
        for token_id in tokens:
            req.output_ids.append(token_id)
            appended += 1
            req.check_finished()
            if req.finished():
                break
            if req.grammar is not None:
                req.grammar.accept_token(token_id)
        host.commit_lens.append(appended)
        host.new_verified.append(int(req.output_ids[-1]))
        host.accepted.append(appended - 1)
        req.spec_verify_ct += 1
        req.spec_accepted_drafts += appended - 1
        req.update_spec_acceptance_histogram(appended - 1)
        req.kv_committed_len += appended
        req.kv_allocated_len = req.kv_committed_len
    return host


def commit_on_device(batch: ScheduleBatch, verify_width: int, acceptance: PackedAcceptance, host: HostCommit,
                     hidden: torch.Tensor) -> DeviceCommit:
    """Keep the committed path nodes' KV (req_to_token, in depth order), free every other
    node's slot, advance the batch's lengths, and gather the next draft context.
    hidden [B * N, F]: the target hidden states at every node."""
    bs = len(host.commit_lens)
    total = sum(host.commit_lens)
    # The one host -> device copy of the step.
    uploaded = torch.tensor(host.commit_lens + host.new_verified, dtype=torch.int64).to(hidden.device)
    commit_lens, new_verified_id = uploaded[:bs], uploaded[bs:]
    commit = commit_path(
        acceptance.path,
        commit_lens,
        batch.out_cache_loc.view(bs, verify_width),
        batch.req_to_token_pool.req_to_token,
        batch.req_pool_indices,
        batch.seq_lens,
        total,
    )
    batch.token_to_kv_pool_allocator.free(commit.freed_slots)
    batch.out_cache_loc = commit.kept_slots
    batch.seq_lens.add_(commit_lens.to(batch.seq_lens.dtype))
    batch.seq_lens_cpu.add_(torch.tensor(host.commit_lens, dtype=batch.seq_lens_cpu.dtype))
    batch.seq_lens_sum += total
    next_hidden = hidden.reshape(bs * verify_width, -1).index_select(0, commit.kept_nodes)
    return DeviceCommit(new_verified_id, commit_lens.to(torch.int32), next_hidden)


def trace_step(draft: StepDraft, reqs: List[Req], committed: List[List[int]], host: HostCommit,
               all_greedy: bool) -> None:
    """The step's trace records: per greedy request the tokens it appended (cut at a finish) and
    its decode step from 0 (record_on_requests has already counted this one). Sampled requests
    are left out: tune replays greedy acceptance, which a sampled step's text does not give."""
    # SGLang turns temperature 0 into top_k 1; top_k 1 at any temperature is the argmax too.
    rows = range(len(reqs)) if all_greedy else [i for i, req in enumerate(reqs) if req.sampling_params.top_k == 1]
    if not rows:
        return
    draft.record(
        [reqs[i].rid for i in rows],
        [reqs[i].spec_verify_ct - 1 for i in rows],
        [committed[i][:host.commit_lens[i]] for i in rows],
        rows=None if all_greedy else list(rows),
    )


@dataclass
class DDTreeVerifyInput(DFlashVerifyInput):
    """DFlash's verify input carrying a DDTree: draft_token_num = budget + 1 nodes per request."""

    step: Optional[StepTree] = None

    @property
    def tree(self) -> DDTree:
        return self.step.tree

    @classmethod
    def from_step(cls, step: StepTree) -> DDTreeVerifyInput:
        return cls(
            draft_token=step.tree.tokens.reshape(-1),
            positions=step.positions.reshape(-1),
            draft_token_num=step.tree.verify_width,
            step=step,
        )

    def prepare_for_verify(self, batch: ScheduleBatch, page_size: int, *, build_custom_mask: bool = True) -> None:
        """KV slots for every node (req_to_token[prefix, prefix + N)) and the tree mask."""
        if batch.forward_mode.is_idle():
            return
        if page_size != 1:
            raise RuntimeError(f"DDTree verify needs page_size 1, got {page_size}")
        if not build_custom_mask:
            raise RuntimeError(
                "DDTree verify needs a tree attention mask, but this attention backend skips DFlash's "
                "custom mask; serve DDTree with --attention-backend triton"
            )
        bs = batch.batch_size()
        n = self.draft_token_num
        batch.input_ids = self.draft_token
        batch.out_cache_loc = alloc_token_slots(batch.tree_cache, bs * n)
        assign_node_slots(
            batch.req_to_token_pool.req_to_token, batch.req_pool_indices, batch.seq_lens, batch.out_cache_loc.view(bs, n)
        )
        self.custom_mask = verify_custom_mask(self.step.ancestor, batch.seq_lens, batch.seq_lens_cpu)

    def accept(self, batch: ScheduleBatch, logits: torch.Tensor) -> PackedAcceptance:
        """The accepted path and bonus of every request; logits [B * N, V] (adjusted in place
        for penalties, logit bias and custom processors first, as DFlash does)."""
        bs = batch.batch_size()
        n = self.draft_token_num
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            if len(sampling_info) != bs:
                raise RuntimeError(f"DDTree verify: len(sampling_info)={len(sampling_info)} but bs={bs}")
            apply_logit_adjustments(logits, sampling_info, bs, n)
        if sampling_info is None or sampling_info.is_all_greedy:
            return self.step.accept_greedy(logits)
        probs = target_probs(logits, sampling_info, n)
        if dflash_utils.is_dflash_sampling_verify_available():
            acc = kernel_sampling(self.tree, self.step.retrieve, probs, dflash_utils.tree_speculative_sampling_target_only)
        else:
            acc = verify_sampling(self.tree, probs)
        return PackedAcceptance.pack(self.tree, acc)

    def verify(self, *, batch: ScheduleBatch, logits_output: LogitsProcessorOutput,
               page_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
        """Same contract as DFlashVerifyInput.verify: (new_verified_id [B] i64,
        commit_lens [B] i32, next_target_hidden [sum(commit_lens), F],
        accepted draft tokens per request on the CPU)."""
        if batch.forward_mode.is_idle():
            empty = torch.empty((0,), dtype=torch.int64, device=batch.device)
            return empty, empty.to(torch.int32), empty, []
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree verify requires the target hidden states, but got None")
        acceptance = self.accept(batch, logits_output.next_token_logits)
        committed = acceptance.committed_on_host()
        host = record_on_requests(batch.reqs, committed)
        commit = commit_on_device(batch, self.draft_token_num, acceptance, host, hidden)
        logits_output.hidden_states = None
        if self.step.trace is not None:
            trace_step(self.step.trace, batch.reqs, committed, host,
                       batch.sampling_info is None or batch.sampling_info.is_all_greedy)
        return commit.new_verified_id, commit.commit_lens, commit.next_hidden, host.accepted

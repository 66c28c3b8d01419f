"""The DDTree verify step inside SGLang: prepare the tree forward, accept, commit along the path.

DDTreeVerifyInput is a DFlashVerifyInput (so every `isinstance` check, the
SpecInputType and the attention backends treat it as DFlash's verify input)
whose tokens are the budget + 1 nodes of a DDTree per request instead of a
block. What differs from DFlash:

prepare   positions = prefix length + node depth; the triton custom mask is,
          per request, N rows of (prefix + N) entries, row-major (DFlash's
          layout): the whole prefix, then the tree's ancestor mask. Positions
          and ancestor mask come with the tree (step_graphs.StepTree, built in
          the draft step's CUDA graph where there is one).
accept    greedy: `verify_greedy` (the fused walk on CUDA) over the target's argmax, in
          the verify CUDA graph of step_graphs where there is one;
          sampling: sgl_kernel's `tree_speculative_sampling_target_only` with
          the DDTree's retrieve arrays, draft_probs zeroed on every call (the
          kernel writes rejected siblings' mass into it) and both thresholds 1,
          which is exact; without the kernel, the torch walk `verify_sampling`.
commit    the accepted path's KV slots stay, in depth order, at req_to_token
          [prefix, prefix + commit_len); every other node's slot is freed; the
          target hidden states at the path's nodes are the next draft context.
          A path's node at depth d sits at position prefix + d and attended
          only to its ancestors, so its KV is what an autoregressive step writes.

Everything returned is a fresh tensor (index copies), never a view into the
CUDA-graph output buffers (the target's and step_graphs'), which the next
replay overwrites.

Host syncs per step: one device -> host copy (tokens, path and accept length
together) for the per-request loop DFlash also has, then one host -> device
copy of every index the commit needs; no boolean-mask indexing (a nonzero
sync each) anywhere, so greedy verify syncs less than DFlash's own. Sampling
adds what DFlash's sampling adds (the largest top-k, read on the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from k26_ddtree.core.retrieve import compile_ddtree_retrieve
from k26_ddtree.sglang.step_graphs import StepTree, pack_acceptance
from k26_ddtree.core.tree import DDTree
from k26_ddtree.core.verify import Acceptance, verify_sampling
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.mem_cache.common import alloc_token_slots
from sglang.srt.speculative import dflash_utils
from sglang.srt.speculative.dflash_info import DFlashVerifyInput


def verify_custom_mask(ancestor: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor) -> torch.Tensor:
    """Flat bool mask for the triton TARGET_VERIFY kernel.

    ancestor [B, N, N] bool (tree_attention_mask); prefix_lens [B] on the mask's
    device and the same values on the CPU (sizes the output without a host sync).
    Request b owns N * (prefix_b + N) entries: row i = prefix_b Trues, then ancestor[b, i].
    """
    batch, n, _ = ancestor.shape
    device = ancestor.device
    row_len_cpu = prefix_lens_cpu.to(torch.int64) + n
    total = int((row_len_cpu * n).sum())
    mask = torch.ones(total, dtype=torch.bool, device=device)
    if batch == 0:
        return mask
    prefix = prefix_lens.to(device=device, dtype=torch.int64)
    row_len = prefix + n
    entries = row_len * n
    # Where request b's ancestor block starts: its first row, past its prefix.
    block_start = torch.cumsum(entries, dim=0) - entries + prefix
    node = torch.arange(n, device=device)
    index = block_start.view(batch, 1, 1) + node.view(1, n, 1) * row_len.view(batch, 1, 1) + node.view(1, 1, n)
    mask[index.reshape(-1)] = ancestor.reshape(-1)
    return mask


@dataclass
class PathCommit:
    """What survives a verify step, batch-major and in depth order within a request.

    kept_slots  [sum(commit_lens)] KV slots of the committed path nodes (root first)
    freed_slots [B * N - sum(commit_lens)] every other node's slot
    hidden      [sum(commit_lens), F] target hidden states at the committed nodes
    """

    kept_slots: torch.Tensor
    freed_slots: torch.Tensor
    hidden: torch.Tensor


def commit_path(kept_nodes: torch.Tensor, node_slots: torch.Tensor, hidden: torch.Tensor) -> PathCommit:
    """kept_nodes [T] flat node indices (b * N + local) of the committed path nodes,
    batch-major and in depth order within a request; node_slots [B, N] the KV slot of
    every node; hidden [B, N, F] the target hidden state at every node.

    No host sync: the freed nodes are the first B * N - T of a stable sort that puts
    kept nodes last (T is known from kept_nodes' shape), in node order.
    """
    batch, n = node_slots.shape
    is_kept = torch.zeros(batch * n, dtype=torch.uint8, device=node_slots.device)
    is_kept[kept_nodes] = 1
    freed_nodes = torch.argsort(is_kept, stable=True)[: batch * n - kept_nodes.shape[0]]
    slots = node_slots.reshape(-1)
    return PathCommit(
        kept_slots=slots[kept_nodes],
        freed_slots=slots[freed_nodes],
        hidden=hidden.reshape(batch * n, -1)[kept_nodes],
    )


def _top_k_renorm(probs: torch.Tensor, top_ks: torch.Tensor) -> torch.Tensor:
    kth = probs.sort(dim=-1, descending=True).values.gather(1, (top_ks.long() - 1).clamp(min=0).unsqueeze(1))
    kept = torch.where(probs >= kth, probs, 0.0)
    return kept / kept.sum(dim=-1, keepdim=True)


def _top_p_renorm(probs: torch.Tensor, top_ps: torch.Tensor) -> torch.Tensor:
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs = torch.where(mass_before < top_ps.unsqueeze(1), sorted_probs, 0.0)
    kept = torch.zeros_like(probs).scatter_(1, order, sorted_probs)
    return kept / kept.sum(dim=-1, keepdim=True)


def target_probs(logits: torch.Tensor, sampling_info, num_nodes: int) -> torch.Tensor:
    """[B, N, V] the target's next-token law at every node: temperature, then top-k
    (top-k first, as DFlash does), then top-p."""
    temperatures = torch.repeat_interleave(sampling_info.temperatures, num_nodes, dim=0)
    scaled = logits / temperatures
    vocab = scaled.shape[-1]
    need_top_k = bool(getattr(sampling_info, "need_top_k_sampling", True))
    need_top_p = bool(getattr(sampling_info, "need_top_p_sampling", False))
    top_ps = torch.repeat_interleave(sampling_info.top_ps, num_nodes, dim=0) if need_top_p else None
    top_p_renorm = dflash_utils.top_p_renorm_prob or _top_p_renorm
    probs = None
    if need_top_k:
        top_ks = torch.repeat_interleave(sampling_info.top_ks, num_nodes, dim=0).to(torch.int64).clamp(1, vocab)
        max_top_k = int(top_ks.max())
        if max_top_k < vocab:
            # Sparse: only the max_top_k best logits can carry mass.
            top_logits, top_index = scaled.topk(max_top_k, dim=-1)
            ranks = torch.arange(max_top_k, device=scaled.device).unsqueeze(0)
            top_logits = top_logits.masked_fill(ranks >= top_ks.unsqueeze(1), float("-inf"))
            top = F.softmax(top_logits, dim=-1)
            if need_top_p:
                top = top_p_renorm(top, top_ps)
            probs = torch.zeros_like(scaled).scatter_(1, top_index, top)
    if probs is None:
        probs = F.softmax(scaled, dim=-1)
        if need_top_k:
            probs = (dflash_utils.top_k_renorm_prob or _top_k_renorm)(probs, top_ks)
        if need_top_p:
            probs = top_p_renorm(probs, top_ps)
    return probs.view(-1, num_nodes, vocab).contiguous()


def kernel_sampling(tree: DDTree, probs: torch.Tensor, kernel) -> Acceptance:
    """Sample-and-match through sgl_kernel's tree_speculative_sampling_target_only.

    The kernel walks first-child / next-sibling lists with one coin per level and
    accepts a child when the coin falls under the running target mass of the
    siblings tried; with both thresholds 1 that is exact. It writes rejected
    siblings' mass into draft_probs, hence a zeroed tensor on every call.
    """
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    depth = tree.depth_cap()
    retrieve_index, next_token, next_sibling = compile_ddtree_retrieve(tree)
    predicts = torch.zeros(batch * n, dtype=torch.int32, device=device)
    accept_index = torch.full((batch, depth + 1), -1, dtype=torch.int32, device=device)
    accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
    kernel(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=tree.tokens.contiguous(),
        retrive_index=retrieve_index,
        retrive_next_token=next_token,
        retrive_next_sibling=next_sibling,
        uniform_samples=torch.rand((batch, n), dtype=torch.float32, device=device),
        uniform_samples_for_final_sampling=torch.rand((batch,), dtype=torch.float32, device=device),
        target_probs=probs.float().contiguous(),
        draft_probs=torch.zeros((batch, n, probs.shape[-1]), dtype=torch.float32, device=device),
        threshold_single=1.0,
        threshold_acc=1.0,
        deterministic=True,
    )
    accept_len = accept_token_num.to(torch.long)
    steps = torch.arange(depth + 1, device=device).unsqueeze(0)
    on_path = steps <= accept_len.unsqueeze(1)
    row_base = torch.arange(batch, device=device).unsqueeze(1) * n
    path = torch.where(on_path, accept_index.to(torch.long) - row_base, -1)
    last = accept_index.to(torch.long).gather(1, accept_len.unsqueeze(1)).squeeze(1)
    return Acceptance(accept_len=accept_len, path=path, next_token=predicts.to(torch.long)[last])


def _apply_logit_adjustments(logits: torch.Tensor, sampling_info, batch_size: int, num_nodes: int) -> None:
    """Custom logit processors, penalties and logit bias, as DFlash's verify applies them."""
    if sampling_info.has_custom_logit_processor:
        apply_custom_logit_processor(logits, sampling_info, num_tokens_in_batch=num_nodes)
    if sampling_info.penalizer_orchestrator.is_required or sampling_info.logit_bias is not None:
        linear_penalty = torch.zeros((batch_size, logits.shape[1]), dtype=torch.float32, device=logits.device)
        sampling_info.apply_logits_bias(linear_penalty)
        logits.add_(torch.repeat_interleave(linear_penalty, num_nodes, dim=0))


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
            draft_token_num=step.tree.num_nodes,
            step=step,
        )

    def prepare_for_verify(self, batch, page_size: int, *, build_custom_mask: bool = True):
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
        req_to_token = batch.req_to_token_pool.req_to_token
        cols = batch.seq_lens.to(torch.int64).unsqueeze(1) + torch.arange(n, device=req_to_token.device)
        rows = batch.req_pool_indices.to(torch.int64).unsqueeze(1)
        req_to_token[rows, cols] = batch.out_cache_loc.view(bs, n).to(req_to_token.dtype)
        self.custom_mask = verify_custom_mask(self.step.ancestor, batch.seq_lens, batch.seq_lens_cpu)

    def _accept(self, batch, logits: torch.Tensor) -> torch.Tensor:
        """[B, 2 * (D + 1) + 1] long: committed tokens, accepted path, accept length
        (step_graphs.pack_acceptance)."""
        bs = batch.batch_size()
        n = self.draft_token_num
        sampling_info = batch.sampling_info
        if sampling_info is not None:
            if len(sampling_info) != bs:
                raise RuntimeError(f"DDTree verify: len(sampling_info)={len(sampling_info)} but bs={bs}")
            _apply_logit_adjustments(logits, sampling_info, bs, n)
        if sampling_info is None or sampling_info.is_all_greedy:
            return self.step.greedy_packed(torch.argmax(logits, dim=-1).view(bs, n))
        probs = target_probs(logits, sampling_info, n)
        if dflash_utils.is_dflash_sampling_verify_available():
            acc = kernel_sampling(self.tree, probs, dflash_utils.tree_speculative_sampling_target_only)
        else:
            acc = verify_sampling(self.tree, probs)
        return pack_acceptance(self.tree, acc)

    def verify(self, *, batch, logits_output, page_size: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, List[int]]:
        """Same contract as DFlashVerifyInput.verify: (new_verified_id [B] i64,
        commit_lens [B] i32, next_target_hidden [sum(commit_lens), F],
        accepted draft tokens per request on the CPU)."""
        if batch.forward_mode.is_idle():
            empty = torch.empty((0,), dtype=torch.int64, device=batch.device)
            return empty, empty.to(torch.int32), empty, []
        bs = batch.batch_size()
        n = self.draft_token_num
        logits = logits_output.next_token_logits
        device = logits.device
        packed = self._accept(batch, logits)
        width = (packed.shape[1] - 1) // 2
        commit_lens_cpu: List[int] = []
        accepted_cpu: List[int] = []
        new_verified: List[int] = []
        kept_nodes: List[int] = []
        kept_rows: List[int] = []
        kept_depths: List[int] = []
        # The one device -> host copy of the step: committed tokens, accepted path, accept length.
        for i, (req, row) in enumerate(zip(batch.reqs, packed.cpu().tolist())):
            accept_len = row[-1]
            appended = 0
            for token_id in row[: accept_len + 1]:
                req.output_ids.append(token_id)
                appended += 1
                req.check_finished()
                if req.finished():
                    break
                if req.grammar is not None:
                    req.grammar.accept_token(token_id)
            commit_lens_cpu.append(appended)
            accepted_cpu.append(appended - 1)
            new_verified.append(int(req.output_ids[-1]))
            kept_nodes.extend(i * n + node for node in row[width : width + appended])
            kept_rows.extend([i] * appended)
            kept_depths.extend(range(appended))
            req.spec_verify_ct += 1
            req.spec_accepted_drafts += appended - 1
            req.update_spec_acceptance_histogram(appended - 1)
            req.kv_committed_len += appended
            req.kv_allocated_len = req.kv_committed_len

        # The one host -> device copy: everything the commit indexes with.
        kept = len(kept_nodes)
        uploaded = torch.tensor(
            commit_lens_cpu + new_verified + kept_nodes + kept_rows + kept_depths, dtype=torch.int64
        ).to(device)
        commit_lens = uploaded[:bs].to(torch.int32)
        new_verified_id = uploaded[bs : 2 * bs]
        kept_index = uploaded[2 * bs :].view(3, kept)
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree verify requires the target hidden states, but got None")
        commit = commit_path(kept_index[0], batch.out_cache_loc.view(bs, n), hidden.view(bs, n, -1))
        batch.token_to_kv_pool_allocator.free(commit.freed_slots)
        batch.out_cache_loc = commit.kept_slots
        # The path's slots go to req_to_token[prefix + depth], in depth order.
        req_to_token = batch.req_to_token_pool.req_to_token
        kept_rows_dev = kept_index[1]
        req_to_token[
            batch.req_pool_indices.to(torch.int64)[kept_rows_dev],
            batch.seq_lens.to(torch.int64)[kept_rows_dev] + kept_index[2],
        ] = commit.kept_slots.to(req_to_token.dtype)
        batch.seq_lens.add_(commit_lens.to(batch.seq_lens.dtype))
        batch.seq_lens_cpu.add_(torch.tensor(commit_lens_cpu, dtype=batch.seq_lens_cpu.dtype))
        batch.seq_lens_sum += sum(commit_lens_cpu)
        logits_output.hidden_states = None
        return new_verified_id, commit_lens, commit.hidden, accepted_cpu

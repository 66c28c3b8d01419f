"""The maths of the DDTree verify inside SGLang: its tree mask and KV layout, and the sampling path.

  verify_custom_mask   the triton TARGET_VERIFY mask: per request N rows of (prefix + N)
                       entries, row-major (DFlash's layout): the whole prefix, then the
                       tree's ancestor mask
  assign_node_slots    req_to_token[prefix, prefix + N) = the nodes' KV slots, as DFlash
                       assigns its block
  commit_path          the accepted paths' KV slots, in depth order, to req_to_token
                       [prefix, prefix + commit_len); every other node's slot to free; which
                       nodes' hidden states feed the next draft
  target_probs, kernel_sampling, apply_logit_adjustments
                       the sampling verify: the target's law at every node, and
                       sample-and-match through sgl_kernel's tree kernel

A committed path node at depth d sits at position prefix + d and attended only
to its ancestors, so its KV is what an autoregressive step writes. The mask and
the commit are one fused Triton kernel each on CUDA (verify_kernels.py), these
torch ops elsewhere; neither syncs with the host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F

from k26_ddtree.core.fused import fused_kernel
from k26_ddtree.core.tree import DDTree
from k26_ddtree.core.verify import Acceptance
from sglang.srt.layers.sampler import apply_custom_logit_processor
from sglang.srt.speculative import dflash_utils, spec_utils

if TYPE_CHECKING:
    from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo


def verify_custom_mask(ancestor: torch.Tensor, prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor,
                       *, fused: bool | None = None) -> torch.Tensor:
    """Flat bool mask for the triton TARGET_VERIFY kernel.

    ancestor [B, N, N] bool (tree_attention_mask); prefix_lens [B] on the mask's
    device, and prefix_lens_cpu the same values or upper bounds on the CPU (they size the output
    without a host sync; the kernel reads the mask through offsets from the device lengths, so
    entries past the true total are never read).
    Request b owns N * (prefix_b + N) entries: row i = prefix_b Trues, then ancestor[b, i].
    """
    batch, n, _ = ancestor.shape
    total = int((prefix_lens_cpu.to(torch.int64) + n).sum()) * n
    kernel = fused_kernel(fused, ancestor, n, "sglang.common.verify_kernels", "verify_custom_mask_fused")
    if kernel is not None:
        return kernel(ancestor, prefix_lens, total)
    device = ancestor.device
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


def assign_node_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                      node_slots: torch.Tensor) -> None:
    """req_to_token[req_pool_indices[b], prefix_lens[b] + i] = node_slots[b, i] for the N nodes;
    on CUDA through the triton kernel DFlash assigns its block with."""
    batch, n = node_slots.shape
    if node_slots.is_cuda:
        spec_utils.assign_req_to_token_pool_func(
            req_pool_indices, req_to_token, prefix_lens, prefix_lens + n, node_slots.reshape(-1), batch
        )
        return
    cols = prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(n, device=req_to_token.device)
    req_to_token[req_pool_indices.to(torch.int64).unsqueeze(1), cols] = node_slots.to(req_to_token.dtype)


@dataclass
class PathCommit:
    """What survives a verify step, batch-major and in depth order within a request.

    kept_slots  [T] KV slots of the committed path nodes (root first), T = sum(commit_lens)
    freed_slots [B * N - T] every other node's slot, in node order
    kept_nodes  [T] flat node index (b * N + local) of each kept slot: rows of the target
                hidden states that become the next draft context
    """

    kept_slots: torch.Tensor
    freed_slots: torch.Tensor
    kept_nodes: torch.Tensor


def commit_path(path: torch.Tensor, commit_lens: torch.Tensor, node_slots: torch.Tensor, req_to_token: torch.Tensor,
                req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor, total: int,
                *, fused: bool | None = None) -> PathCommit:
    """Commit the first commit_lens[b] nodes of every accepted path, writing req_to_token
    [req_pool_indices[b], prefix_lens[b] + d] = the slot of path[b, d].

    path [B, P] long local node indices (PackedAcceptance.path, root first); commit_lens [B]
    long (<= P: the host may stop a path early, at a finished request); node_slots [B, N];
    total = sum(commit_lens), known on the host, so nothing here waits for the device.
    """
    batch, n = node_slots.shape
    kernel = fused_kernel(fused, node_slots, n, "sglang.common.verify_kernels", "commit_path_fused")
    if kernel is not None:
        return PathCommit(*kernel(path, commit_lens, node_slots, req_to_token, req_pool_indices, prefix_lens, total))
    width = path.shape[1]
    device = node_slots.device
    on_path = torch.arange(width, device=device).unsqueeze(0) < commit_lens.unsqueeze(1)
    # A stable sort putting committed entries first keeps them batch-major and in depth order.
    order = torch.argsort((~on_path).reshape(-1).to(torch.uint8), stable=True)[:total]
    request, depth = order // width, order % width
    kept_nodes = request * n + path.reshape(-1)[order]
    slots = node_slots.reshape(-1)
    kept_slots = slots[kept_nodes]
    is_kept = torch.zeros(batch * n, dtype=torch.uint8, device=device)
    is_kept[kept_nodes] = 1
    freed_nodes = torch.argsort(is_kept, stable=True)[: batch * n - total]
    req_to_token[req_pool_indices.to(torch.int64)[request], prefix_lens.to(torch.int64)[request] + depth] = (
        kept_slots.to(req_to_token.dtype)
    )
    return PathCommit(kept_slots=kept_slots, freed_slots=slots[freed_nodes], kept_nodes=kept_nodes)


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


def target_probs(logits: torch.Tensor, sampling_info: SamplingBatchInfo, verify_width: int,
                 max_top_k: int | None = None) -> torch.Tensor:
    """[B, N, V] the target's next-token law at every node: temperature, then top-k
    (top-k first, as DFlash does), then top-p. min_p is not applied, as in DFlash's verify.
    max_top_k: the batch's largest top-k where the host knows it (else read from the device)."""
    temperatures = torch.repeat_interleave(sampling_info.temperatures, verify_width, dim=0)
    scaled = logits / temperatures
    vocab = scaled.shape[-1]
    need_top_k = bool(getattr(sampling_info, "need_top_k_sampling", True))
    need_top_p = bool(getattr(sampling_info, "need_top_p_sampling", False))
    top_ps = torch.repeat_interleave(sampling_info.top_ps, verify_width, dim=0) if need_top_p else None
    top_p_renorm = dflash_utils.top_p_renorm_prob or _top_p_renorm
    probs = None
    if need_top_k:
        top_ks = torch.repeat_interleave(sampling_info.top_ks, verify_width, dim=0).to(torch.int64).clamp(1, vocab)
        max_top_k = int(top_ks.max()) if max_top_k is None else min(int(max_top_k), vocab)
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
    return probs.view(-1, verify_width, vocab).contiguous()


def kernel_sampling(tree: DDTree, retrieve: tuple[torch.Tensor, torch.Tensor, torch.Tensor], probs: torch.Tensor,
                    kernel: Callable) -> Acceptance:
    """Sample-and-match through sgl_kernel's tree_speculative_sampling_target_only.

    retrieve: compile_ddtree_retrieve(tree). The kernel walks first-child / next-sibling
    lists with one coin per level and accepts a child when the coin falls under the
    running target mass of the siblings tried; with both thresholds 1 that is exact, so
    they are fixed at 1 (the --speculative-accept-threshold flags, which relax exactness,
    do not apply to DDTree). It writes rejected siblings' mass into draft_probs, hence a
    zeroed tensor on every call.
    """
    batch, n = tree.tokens.shape
    device = tree.tokens.device
    depth = tree.depth_cap()
    retrieve_index, next_token, next_sibling = retrieve
    predicts = torch.zeros(batch * n, dtype=torch.int32, device=device)
    accept_index = torch.full((batch, depth + 1), -1, dtype=torch.int32, device=device)
    accept_token_num = torch.zeros(batch, dtype=torch.int32, device=device)
    kernel(
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=tree.tokens.contiguous(),
        retrive_index=retrieve_index.contiguous(),
        retrive_next_token=next_token.contiguous(),
        retrive_next_sibling=next_sibling.contiguous(),
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


def apply_logit_adjustments(logits: torch.Tensor, sampling_info: SamplingBatchInfo, batch_size: int,
                            verify_width: int) -> None:
    """Custom logit processors, penalties and logit bias, as DFlash's verify applies them."""
    if sampling_info.has_custom_logit_processor:
        apply_custom_logit_processor(logits, sampling_info, num_tokens_in_batch=verify_width)
    if sampling_info.penalizer_orchestrator.is_required or sampling_info.logit_bias is not None:
        linear_penalty = torch.zeros((batch_size, logits.shape[1]), dtype=torch.float32, device=logits.device)
        sampling_info.apply_logits_bias(linear_penalty)
        logits.add_(torch.repeat_interleave(linear_penalty, verify_width, dim=0))

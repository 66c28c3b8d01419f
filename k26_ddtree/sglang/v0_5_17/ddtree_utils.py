"""The slot maths of a DDTree verify in SGLang 0.5.17's overlap worker, all on the device.

In 0.5.17 the scheduler reserves KV slots ahead (req_to_token[committed : committed + 2 N] per
request, N the spec bag's count) and frees a request's row past its committed length when it
ends: a step allocates and frees nothing. So the tree's W nodes take the slots already in
req_to_token[prefix, prefix + W), node i at column prefix + i, and the commit permutes that
segment in place: the accepted path's slots first, in depth order (node path[d] at position
prefix + d, where its KV, written attending only to its ancestors, is what an autoregressive step
writes), then every other node's slot, kept in the row for a later step.

  node_slots      req_to_token[prefix, prefix + W) per request
  commit_step     a step's commit: the permutation and what the scheduler and the draft take;
                  one launch of commit_kernel.py on CUDA (warm_up_commit compiles it at
                  start-up), else these torch ops:
  permute_path    the commit permutation, written back to req_to_token; the new segment
  path_rows       rows of the target's hidden states [B * W, F] on the accepted paths [B * P]

Every shape is known on the host (B, W, P); no function reads a device value.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from k26_ddtree.core.fused import fused_kernel


def _columns(prefix_lens: torch.Tensor, width: int) -> torch.Tensor:
    return prefix_lens.to(torch.int64).unsqueeze(1) + torch.arange(width, device=prefix_lens.device)


def node_slots(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
               width: int) -> torch.Tensor:
    """[B, W] int64: the KV slot of every verify node, req_to_token[req, prefix + i]."""
    rows = req_pool_indices.to(torch.int64).unsqueeze(1)
    return req_to_token[rows, _columns(prefix_lens, width)].to(torch.int64)


def permute_path(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor,
                 slots: torch.Tensor, path: torch.Tensor, commit_lens: torch.Tensor) -> torch.Tensor:
    """Reorder each request's req_to_token[prefix, prefix + W): the first commit_lens[b] nodes of
    path[b] in depth order, then the other nodes in node order. Returns the new segment [B, W].

    slots [B, W] (node_slots before this step's commit); path [B, P] local node indices, root first,
    -1 past the accepted ones; commit_lens [B] <= P."""
    batch, width = slots.shape
    depth_count = path.shape[1]
    device = slots.device
    depth = torch.arange(depth_count, device=device).expand(batch, depth_count)
    on_path = depth < commit_lens.to(torch.int64).unsqueeze(1)
    # Off-path nodes sort after the path by node index; path nodes by depth. Entries past a
    # request's commit go to a spare column that is dropped.
    key = torch.cat([depth_count + torch.arange(width, device=device).expand(batch, width),
                     torch.zeros(batch, 1, dtype=torch.int64, device=device)], dim=1)
    key.scatter_(1, torch.where(on_path, path.to(torch.int64), width), depth)
    order = torch.argsort(key[:, :width], dim=1)
    segment = slots.gather(1, order)
    rows = req_pool_indices.to(torch.int64).unsqueeze(1)
    req_to_token[rows, _columns(prefix_lens, width)] = segment.to(req_to_token.dtype)
    return segment


def path_rows(path: torch.Tensor, width: int) -> torch.Tensor:
    """[B * P] rows of a [B * W, F] per-node tensor along each accepted path (the root's row past
    the accepted ones: read, never committed)."""
    batch = path.shape[0]
    base = torch.arange(batch, device=path.device).unsqueeze(1) * width
    return (base + path.to(torch.int64).clamp(min=0)).reshape(-1)


class StepCommit(NamedTuple):
    """A committed step, device tensors (L = min(W, P)):

    cache_loc     [B, L] long: req_to_token[prefix, prefix + L) after the commit
    out_tokens    [B, P] long: accepted drafts then the bonus, 0 past it
    commit_lens   [B] int32: accepted drafts + 1
    bonus         [B] long
    new_seq_lens  [B], prefix_lens' dtype: prefix + commit_lens
    positions     [B * P] long: prefix + depth
    hidden_rows   [B * P] long: path_rows
    """

    cache_loc: torch.Tensor
    out_tokens: torch.Tensor
    commit_lens: torch.Tensor
    bonus: torch.Tensor
    new_seq_lens: torch.Tensor
    positions: torch.Tensor
    hidden_rows: torch.Tensor


def commit_step(rows: torch.Tensor, slots: torch.Tensor, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                prefix_lens: torch.Tensor, fused: bool | None = None) -> StepCommit:
    """Commit every request's accepted path: rows PackedAcceptance.rows [B, 2P + 1], slots
    node_slots [B, W]. fused: commit_kernel.py's one launch (None: on CUDA), else the torch ops
    here, which define it."""
    width = slots.shape[1]
    kernel = fused_kernel(fused, slots, width, "sglang.v0_5_17.commit_kernel", "commit_fused")
    if kernel is not None:
        return StepCommit(*kernel(rows, slots, req_to_token, req_pool_indices, prefix_lens))
    span = (rows.shape[1] - 1) // 2
    accept_len = rows[:, -1]
    committed = rows[:, :span]
    path = rows[:, span : 2 * span]
    commit_lens = (accept_len + 1).to(torch.int32)
    segment = permute_path(req_to_token, req_pool_indices, prefix_lens, slots, path, commit_lens)
    return StepCommit(
        cache_loc=segment[:, :span].contiguous(),
        out_tokens=committed.clamp(min=0),
        commit_lens=commit_lens,
        bonus=committed.gather(1, accept_len.unsqueeze(1)).squeeze(1),
        new_seq_lens=prefix_lens + commit_lens.to(prefix_lens.dtype),
        positions=_columns(prefix_lens, span).reshape(-1),
        hidden_rows=path_rows(path, width),
    )


def warm_up_commit(width: int, depth: int, device, fused: bool | None = None) -> None:
    """One commit of a tree of `width` nodes and depth cap `depth` on placeholder rows, at
    start-up: where commit_step takes the fused kernel, it compiles here, not in a decode step."""
    span = depth + 1
    rows = torch.zeros(1, 2 * span + 1, dtype=torch.long, device=device)
    slots = torch.arange(width, device=device).view(1, width)
    req_to_token = torch.zeros(1, width + span, dtype=torch.int32, device=device)
    zero = torch.zeros(1, dtype=torch.long, device=device)
    commit_step(rows, slots, req_to_token, zero, zero, fused)

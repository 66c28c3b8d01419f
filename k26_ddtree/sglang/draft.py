"""Draft top-K: the K most likely tokens per draft position and their log-probs, under TP.

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
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from k26_ddtree.sglang.step_graphs import StepGraphs, StepTree

ROWS_PER_CHUNK = 256


def _shard_logits(hidden: torch.Tensor, lm_head) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logits [M, n] float32, global token id of each column [n]) of this rank's vocab shard;
    the ids are None when the columns are the base vocab alone, which starts at
    org_vocab_start_index (the usual case: no id table to build and gather per step)."""
    shard = lm_head.shard_indices
    weight = lm_head.weight
    num_org = int(shard.num_org_elements)
    num_org_padded = int(shard.num_org_elements_padded)
    num_added = int(shard.num_added_elements)
    hs = hidden if hidden.dtype == weight.dtype else hidden.to(weight.dtype)
    logits = torch.matmul(hs, weight[:num_org].T).float()
    if num_added == 0:
        return logits, None
    # Added (e.g. LoRA) vocab sits after the padded base vocab in the local weight.
    device = hidden.device
    added = torch.matmul(hs, weight[num_org_padded : num_org_padded + num_added].T).float()
    ids = torch.cat(
        [
            torch.arange(num_org, device=device) + int(shard.org_vocab_start_index),
            torch.arange(num_added, device=device) + int(shard.added_vocab_start_index),
        ]
    )
    return torch.cat([logits, added], dim=1), ids


def _chunk_topk(hidden: torch.Tensor, lm_head, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    logits, column_ids = _shard_logits(hidden, lm_head)
    k = min(topk, logits.shape[1])
    top = logits.topk(k, dim=1)
    if column_ids is None:
        token_ids = top.indices + int(lm_head.shard_indices.org_vocab_start_index)
    else:
        token_ids = column_ids[top.indices]
    values = top.values
    if k < topk:
        values = F.pad(values, (0, topk - k), value=float("-inf"))
        token_ids = F.pad(token_ids, (0, topk - k), value=0)
    return values, token_ids, torch.logsumexp(logits, dim=1)


def shard_topk(hidden: torch.Tensor, lm_head, topk: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """This rank's part: (values [M, K] f32, token ids [M, K] long, log-sum-exp [M] f32).

    A shard with fewer than K tokens pads with -inf values, which never win the merge.
    Rows go through the lm_head in chunks of ROWS_PER_CHUNK to bound the fp32 logits.
    """
    rows = hidden.shape[0]
    if rows <= ROWS_PER_CHUNK:
        return _chunk_topk(hidden, lm_head, topk)
    parts = [
        _chunk_topk(hidden[start : start + ROWS_PER_CHUNK], lm_head, topk)
        for start in range(0, rows, ROWS_PER_CHUNK)
    ]
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


def topk_logprobs(
    hidden: torch.Tensor, lm_head, topk: int, tp_group=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(token ids [M, K] long, log-probs [M, K] float32, descending along K) for hidden [M, H].

    tp_group: SGLang's GroupCoordinator (world_size, all_gather_into_tensor); None or
    world_size 1 means the lm_head holds the whole vocabulary.
    """
    values, token_ids, lse = shard_topk(hidden, lm_head, topk)
    tp = 1 if tp_group is None else int(tp_group.world_size)
    if tp == 1:
        # One shard is the whole vocabulary: its top-K, already descending, is the answer.
        return token_ids, (values - lse.unsqueeze(1)).clamp(max=0.0)
    rows = hidden.shape[0]
    gathered_values = values.new_empty((tp * rows, topk))
    gathered_ids = token_ids.new_empty((tp * rows, topk))
    gathered_lse = lse.new_empty((tp * rows,))
    tp_group.all_gather_into_tensor(gathered_values, values.contiguous())
    tp_group.all_gather_into_tensor(gathered_ids, token_ids.contiguous())
    tp_group.all_gather_into_tensor(gathered_lse, lse.contiguous())
    return merge_shards(
        gathered_values.view(tp, rows, topk),
        gathered_ids.view(tp, rows, topk),
        gathered_lse.view(tp, rows),
        topk,
    )


def draft_tree(
    config,
    verified_id: torch.Tensor,
    draft_hidden: torch.Tensor,
    lm_head,
    tp_group,
    *,
    prefix_lens: torch.Tensor,
    graphs: StepGraphs,
    oracle=None,
    reqs=None,
) -> StepTree:
    """The DDTree of one decode step, with its ancestor mask and positions.

    config        DDTreeConfig
    verified_id   [B] the last committed token, the root of every tree
    draft_hidden  [B, block_size, H] the draft block's hidden states; position 0 is the root's
    prefix_lens   [B] committed tokens with KV in the target cache; the root sits at position prefix_len
    graphs        the worker's StepGraphs: the tree is built in its CUDA graph for this batch size,
                  or eagerly where it falls back
    oracle        test-only Oracle rewriting the top-K of the requests it knows (None: off)
    """
    batch, block, hidden_size = draft_hidden.shape
    tokens, logprobs = topk_logprobs(
        draft_hidden[:, 1:, :].reshape(-1, hidden_size), lm_head, config.topk, tp_group
    )
    tokens = tokens.view(batch, block - 1, config.topk)
    logprobs = logprobs.view(batch, block - 1, config.topk)
    if oracle is not None:
        tokens, logprobs = oracle.rewrite(reqs, tokens, logprobs)
    return graphs.draft(verified_id, tokens, logprobs, prefix_lens, config.budget, config.spine)

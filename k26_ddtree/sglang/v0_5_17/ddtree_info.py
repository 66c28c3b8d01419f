"""One overlap step's DDTree state: the verify input, the acceptance and the on-device commit.

DDTreeVerifyInputV2 is a DFlashVerifyInput (SGLang's backends, graph runner and SpecInputType
treat it as DFlash's) whose W tokens per request are a DDTree's nodes (W = budget + 1, the verify
width of the batch's bucket, which its own target graphs hold), with the tree mask and the nodes' KV
slots. After the target forward:

  accept   greedy: the walk over the target's argmax (in the step's verify graph where there is
           one); sampling: sgl_kernel's exact tree-sampling kernel (the torch walk without it)
           -> PackedAcceptance [B, 2 * P + 1], P = D + 1
  commit   the path's KV slots to req_to_token in depth order (ddtree_utils.commit_step, one
           fused launch on CUDA), and
           what the scheduler and the draft need, as SGLang's DFlash delivers them:
           out_tokens [B, P] (accepted drafts then the bonus), commit_lens [B] int32,
           new_seq_lens [B], the bonus [B], and the path's target hidden states, positions and
           slots for the draft KV append

Nothing here copies to the host or waits for the device: the scheduler reads tokens and lengths
a step later from what the worker returns. Every tensor returned is fresh (index copies), never a
view of a CUDA-graph output buffer that the next step's replay overwrites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from k26_ddtree.core.verify import PackedAcceptance, verify_sampling
from k26_ddtree.sglang.common.step_graphs import StepTree
from k26_ddtree.sglang.common.verify_utils import kernel_sampling, target_probs, verify_custom_mask
from k26_ddtree.sglang.v0_5_17.ddtree_utils import commit_step, node_slots
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative import dflash_utils
from sglang.srt.speculative.dflash_info import DFlashVerifyInput


@dataclass
class DDTreeCommit:
    """A committed step, as the scheduler and the draft KV append take it.

    out_tokens        [B, P] long: accepted drafts then the bonus (0 past it); the stride is P
    commit_lens       [B] int32: accepted drafts + 1
    bonus             [B] long: the next step's root
    new_seq_lens      [B] long: prefix + commit_lens
    draft_hidden      [B * P, F] target hidden states along the paths
    draft_positions   [B * P] long: prefix + depth
    draft_cache_loc   [B, P] long: the path's slots, req_to_token[prefix, prefix + P) after the commit
    """

    out_tokens: torch.Tensor
    commit_lens: torch.Tensor
    bonus: torch.Tensor
    new_seq_lens: torch.Tensor
    draft_hidden: torch.Tensor
    draft_positions: torch.Tensor
    draft_cache_loc: torch.Tensor


@dataclass
class DDTreeVerifyInputV2(DFlashVerifyInput):
    """DFlash's verify input carrying a DDTree: draft_token_num = W tokens per request.

    step        the drafted tree (tree, ancestor mask, positions, retrieve links)
    node_slots  [B, W] the nodes' KV slots, req_to_token[prefix, prefix + W) at this step's start
    """

    step: Optional[StepTree] = None
    node_slots: Optional[torch.Tensor] = None

    @classmethod
    def build(cls, step: StepTree, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
              prefix_lens: torch.Tensor, prefix_lens_cpu: torch.Tensor) -> DDTreeVerifyInputV2:
        """The verify of `step`'s trees, one token per node; prefix_lens [B] on the device,
        prefix_lens_cpu [B] on the host: the same values or upper bounds (they size the mask)."""
        width = step.tree.tokens.shape[1]
        return cls(
            draft_token=step.tree.tokens.reshape(-1),
            positions=step.positions.reshape(-1),
            draft_token_num=width,
            custom_mask=verify_custom_mask(step.ancestor, prefix_lens, prefix_lens_cpu),
            capture_hidden_mode=CaptureHiddenMode.FULL,
            step=step,
            node_slots=node_slots(req_to_token, req_pool_indices, prefix_lens, width),
        )

    def accept(self, logits: torch.Tensor, sampling_info, max_top_k: int) -> PackedAcceptance:
        """The accepted path and bonus of every request; logits [B * W, V], already adjusted
        (penalties, bias, grammar) as SGLang's DFlash verify adjusts them. max_top_k: the batch's
        largest top-k, known on the host."""
        tree = self.step.tree
        if sampling_info is None or sampling_info.is_all_greedy:
            return self.step.accept_greedy(logits)
        probs = target_probs(logits, sampling_info, tree.tokens.shape[1], max_top_k=max_top_k)
        if dflash_utils.is_dflash_sampling_verify_available():
            acc = kernel_sampling(tree, self.step.retrieve, probs, dflash_utils.tree_speculative_sampling_target_only)
        else:
            acc = verify_sampling(tree, probs)
        return PackedAcceptance.pack(tree, acc)

    def commit(self, acceptance: PackedAcceptance, req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
               prefix_lens: torch.Tensor, hidden: torch.Tensor, fused: bool | None = None) -> DDTreeCommit:
        """Commit every accepted path on the device (ddtree_utils.commit_step; fused: its one
        kernel launch, None on CUDA). hidden [B * W, F]: the target's hidden states."""
        step = commit_step(acceptance.rows, self.node_slots, req_to_token, req_pool_indices, prefix_lens, fused)
        return DDTreeCommit(
            out_tokens=step.out_tokens,
            commit_lens=step.commit_lens,
            bonus=step.bonus,
            new_seq_lens=step.new_seq_lens,
            draft_hidden=hidden.index_select(0, step.hidden_rows),
            draft_positions=step.positions,
            draft_cache_loc=step.cache_loc,
        )

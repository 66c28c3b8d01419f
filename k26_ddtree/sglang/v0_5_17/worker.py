"""DDTree's decode step inside SGLang 0.5.17's DFlashWorkerV2, with overlap scheduling on.

The patched worker builds a DDTreeV2 in init_cuda_graphs (every step graph captured there) and,
in forward_batch_generation, hands each decode step to DDTreeV2.decode right after its own draft
block forward (prepare, draft KV slots, the draft model's one TARGET_VERIFY forward: unchanged):

  1. draft.py          the drafter of the batch size's bucket: the block's top-K through the target
                       lm_head, the tree, its mask, positions and retrieve links (step_graphs.py:
                       replayed from the bucket's CUDA graph where one holds the batch)
  2. ddtree_info.py    the verify input: W tokens per request (the bucket's verify width, its
                       tree's nodes), the tree mask, the slots req_to_token[prefix, prefix + W) the
                       scheduler reserved
  3. SGLang            prepare_for_verify and the target forward (the graph of W's own runner,
                       which reads the mask: verify_graphs.py, args.verify_needs_mask; eager past
                       its batch sizes, planned for W); the grammar mask over the tree and the
                       logit adjustments as DFlash applies them
  4. ddtree_info.py    accept, then commit on the device (ddtree_utils.py, one fused launch on
                       CUDA): the path's slots permuted to the front
                       of the row, new_seq_lens published at once (on_publish), then the path's
                       target hidden states appended to the draft KV as DFlash appends its chain
  5. the result        DFlash's: next_token_ids strided by P = D + 1 (accepted drafts then the
                       bonus), accept_lens, new_seq_lens, the bonus as the next draft input

The step copies nothing to the host and waits for nothing: the scheduler reads tokens and lengths
from the result a step later, as it reads DFlash's. Only while the server traces does the step
copy its committed tokens to the host (the trace record needs them).

A chain bucket of a schedule ("bs:0") is served as the top-1 tree of block - 1 nodes: the
drafter's argmax chain, verified at the block's width, as DFlash verifies it, and committed
through the same path, with the same greedy output as DFlash's chain. Its target verify costs what
DFlash's does (the same tokens); DFlash's own path would need a verify graph of that width
captured without the mask (the mask policy is one per process, read at capture) and would leave
the bucket's steps out of the trace.
"""

from __future__ import annotations

import logging

import torch

from k26_ddtree.sglang.common.args import DDTreeArgsError, DDTreeConfig, DDTreeSchedule
from k26_ddtree.sglang.common.draft import DDTreeDrafter, DDTreeDrafters, DraftHead, topk_hook_from_env
from k26_ddtree.sglang.common.step_graphs import StepGraphs, StepTree
from k26_ddtree.sglang.common.trace import TraceWriter
from k26_ddtree.sglang.v0_5_17.ddtree_info import DDTreeVerifyInputV2
from k26_ddtree.sglang.v0_5_17.ddtree_utils import warm_up_commit
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.distributed import get_tp_group
from sglang.srt.managers.scheduler import GenerationBatchResult
from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments
from sglang.srt.speculative.spec_utils import GrammarTree, build_grammar_vocab_mask

logger = logging.getLogger(__name__)


def bucket_config(schedule: DDTreeSchedule, index: int) -> DDTreeConfig:
    """The tree a bucket drafts: its config, or for a chain bucket the top-1 tree of the block."""
    bucket = schedule.buckets[index]
    if bucket.config is not None:
        return bucket.config
    return DDTreeConfig(budget=bucket.block_size - 1, topk=1, spine=False, block_size=bucket.block_size)


def graph_batch_sizes(decode_sizes, max_running_requests) -> list[int]:
    """The batch sizes the step graphs capture: SGLang's decode graph sizes, up to the first that
    holds --max-running-requests."""
    sizes = sorted({int(s) for s in decode_sizes or [] if int(s) > 0})
    if max_running_requests:
        sizes = [b for b in sizes if b < max_running_requests] + [b for b in sizes if b >= max_running_requests][:1]
    return sizes


class DDTreeV2:
    """One DFlashWorkerV2's DDTree: its schedule's drafters (a batch's bucket also sets the verify
    width W, its tree's nodes).

    step_counts   while tracing: per request id in the last traced batch, its decode steps so far
    """

    def __init__(self, schedule: DDTreeSchedule, drafters: DDTreeDrafters):
        self.schedule = schedule
        self.drafters = drafters
        self.step_counts: dict[str, int] = {}

    @classmethod
    def for_worker(cls, worker, decode_sizes) -> DDTreeV2 | None:
        """Built at worker start-up, after the target and draft runners; decode_sizes: the batch
        sizes SGLang captures decode graphs for (none when it captures none)."""
        server_args = worker.server_args
        schedule = DDTreeSchedule.from_server_args(server_args)
        if schedule is None:
            return None
        runner = worker.target_worker.model_runner
        configs = [bucket_config(schedule, i) for i in range(len(schedule.buckets))]
        check_target(runner, max(c.topk for c in configs))
        tp_group = get_tp_group()
        head = DraftHead.of(runner.model.lm_head, tp_group if tp_group.world_size > 1 else None)
        hook = topk_hook_from_env()
        traced = server_args.speculative_ddtree_trace is not None
        trace = TraceWriter.for_server(server_args) if traced and worker.ps.tp_rank == 0 else None
        device = torch.device(worker.device)
        sizes = graph_batch_sizes(decode_sizes, server_args.max_running_requests) if device.type == "cuda" else []
        drafters = [
            DDTreeDrafter.for_bucket(config, head, bucket_sizes, server_args, device, hook, trace)
            for config, bucket_sizes in zip(configs, schedule.graph_batch_sizes(sizes))
        ]
        for config in configs:
            warm_up_commit(config.verify_width, config.block_size - 1, device)
        logger.info("DDTree v2 worker: %s; verify widths %s.", schedule.describe(),
                    "/".join(str(b.verify_width) for b in schedule.buckets))
        return cls(schedule, DDTreeDrafters(schedule, drafters, hook))

    def decode(self, worker, batch, draft_input, draft_hidden: torch.Tensor, on_publish=None,
               grammar_barrier=None) -> GenerationBatchResult:
        """One decode step after the worker's draft block forward; draft_hidden [B * block, H]."""
        bs = len(batch.seq_lens)
        prefix_lens = batch.seq_lens
        req_to_token = worker.model_runner.req_to_token_pool.req_to_token
        drafter = self.drafters.for_batch(bs)
        step = drafter.draft(draft_input.bonus_tokens.view(-1), draft_hidden.view(bs, worker.block_size, -1), batch)
        prefix_bound, verify_bound = host_length_bounds(batch, draft_input, step.tree.tokens.shape[1],
                                                        worker.model_runner.model_config.context_len)
        verify = DDTreeVerifyInputV2.build(step, req_to_token, batch.req_pool_indices, prefix_lens, prefix_bound)
        grammar_tree = self._grammar_tree(step) if batch.has_grammar else None
        logits_output, can_run_cuda_graph = self._verify_forward(worker, batch, verify, verify_bound)

        logits = logits_output.next_token_logits
        if batch.has_grammar:
            grammar_mask = build_grammar_vocab_mask(reqs=batch.reqs, tree=grammar_tree, sampling_info=batch.sampling_info,
                                                    device=logits.device, barrier=grammar_barrier)
        else:
            grammar_mask = None
        if batch.sampling_info is not None:
            apply_dflash_verify_logits_adjustments(next_token_logits=logits, sampling_info=batch.sampling_info,
                                                   draft_token_num=verify.draft_token_num)
        if grammar_mask is not None:
            grammar_mask.apply(logits)
        acceptance = verify.accept(logits, batch.sampling_info, draft_input.max_top_k)

        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError("DDTree verify requires the target hidden states, but got None")
        commit = verify.commit(acceptance, req_to_token, batch.req_pool_indices, prefix_lens, hidden)
        fence_req_to_token(worker.war_fastpath_runner, req_to_token.device)
        if on_publish is not None:
            on_publish(commit.new_seq_lens)
        worker._append_target_hidden_to_draft_kv_by_loc(
            target_hidden=commit.draft_hidden, cache_loc=commit.draft_cache_loc.reshape(-1),
            cache_loc_2d=commit.draft_cache_loc, positions=commit.draft_positions, commit_lens=commit.commit_lens,
        )
        logits_output.hidden_states = None
        if step.trace is not None:
            self._trace(step, batch, acceptance)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=commit.out_tokens.reshape(-1),
            accept_lens=commit.commit_lens,
            can_run_cuda_graph=can_run_cuda_graph,
            next_draft_input=worker._make_next_draft_input_decode(bonus_tokens=commit.bonus,
                                                                  new_seq_lens=commit.new_seq_lens),
            speculative_num_draft_tokens=acceptance.width,
            new_seq_lens=commit.new_seq_lens,
        )

    def _verify_forward(self, worker, batch, verify: DDTreeVerifyInputV2, verify_bound: torch.Tensor):
        """SGLang's target verify of `verify`: (logits output, whether its CUDA graph ran);
        verify_bound [B] on the host: the lengths the attention backend plans with."""
        batch.out_cache_loc = verify.node_slots.reshape(-1)
        seq_lens_cpu, seq_lens_sum = batch.seq_lens_cpu, batch.seq_lens_sum
        batch.seq_lens_cpu = verify_bound
        batch.seq_lens_sum = int(verify_bound.sum())
        forward_batch, _ = verify.prepare_for_verify(batch, worker.target_worker)
        batch.seq_lens_cpu, batch.seq_lens_sum = seq_lens_cpu, seq_lens_sum
        out = worker.target_worker.forward_batch_generation(batch=None, forward_batch=forward_batch, is_verify=True,
                                                            skip_attn_backend_init=True)
        return out.logits_output, out.can_run_cuda_graph

    def _grammar_tree(self, step: StepTree) -> GrammarTree:
        """The tree for SGLang's grammar bitmask; started before the target verify launch, as
        SGLang requires."""
        _, next_token, next_sibling = step.retrieve
        return GrammarTree.from_device(next_token, next_sibling, step.tree.tokens)

    def _trace(self, step: StepTree, batch, acceptance) -> None:
        """The step's trace records of its greedy requests; the one host copy a traced step makes.
        Each request's decode steps are counted here: its spec counters trail the overlap step."""
        counts = {req.rid: self.step_counts.get(req.rid, -1) + 1 for req in batch.reqs}
        self.step_counts = counts
        info = batch.sampling_info
        all_greedy = info is None or info.is_all_greedy
        # SGLang turns temperature 0 into top_k 1; top_k 1 at any temperature is the argmax too.
        rows = list(range(len(batch.reqs))) if all_greedy else [
            i for i, req in enumerate(batch.reqs) if req.sampling_params.top_k == 1]
        if not rows:
            return
        committed = acceptance.committed_on_host()
        step.trace.record([batch.reqs[i].rid for i in rows], [counts[batch.reqs[i].rid] for i in rows],
                          [committed[i] for i in rows], rows=None if all_greedy else rows)


def host_length_bounds(batch, draft_input, width: int, context_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Host upper bounds of every request's prefix and of prefix + width ([B] each), read without
    waiting for the device.

    Where an attention backend asks for the host lengths, the scheduler resolves
    batch.seq_lens_cpu to the committed lengths. Otherwise (triton: needs_cpu_seq_lens is False)
    it is None, and the bound is the scheduler's reservation: the host's one-step-stale committed
    length + 2 * speculative_num_draft_tokens, which the patch set makes the widest verify, so it
    covers prefix + width; DFlash's own verify plans with it too. A prefix never passes the context
    length, which keeps the mask within the verify graph's buffer (per request, width *
    (context + width))."""
    if batch.seq_lens_cpu is not None:
        return batch.seq_lens_cpu, batch.seq_lens_cpu + width
    reserved = draft_input.reserved_seq_lens_cpu
    if reserved is None:
        raise RuntimeError("DDTree verify needs a host bound of the sequence lengths: the batch carries neither "
                           "the committed lengths nor the scheduler's reservation")
    return reserved.clamp(max=context_len), reserved


def check_target(model_runner, topk: int) -> None:
    """Reject target models whose verify cannot be a tree, once the model is loaded."""
    if mambaish_config(model_runner.model_config) is not None:
        raise DDTreeArgsError(
            "DDTree cannot verify a tree on hybrid Mamba / linear-attention (GDN) models: their recurrent "
            "state follows one token sequence; use linear DFLASH (drop --speculative-ddtree-budget)"
        )
    vocab_size = int(model_runner.model_config.vocab_size)
    if topk > vocab_size:
        raise DDTreeArgsError(f"--speculative-ddtree-topk {topk} exceeds the vocabulary size {vocab_size}")


def fence_req_to_token(war_runner, device: torch.device) -> None:
    """The scheduler orders its next req_to_token writes (a finished request's row freed, new
    rows) after the event the step's last reader publishes; the commit wrote req_to_token after
    the verify graph published its own, so publish one after the commit."""
    if device.type != "cuda":
        return
    done = torch.cuda.Event()
    done.record()
    war_runner.war_fastpath_read_done_event = done

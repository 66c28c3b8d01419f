"""DDTree inside SGLang 0.5.11's DFlash (spec v1, no overlap scheduler): the code its patched files call.

Here: args.py (the flags' declaration, finalize, the target/draft token split, the slot counts),
ddtree_info.py (the per-batch verify input, accept, commit), schedule_graphs.py (one target verify
graph runner per verify width) and guards.py (verify-width and mask checks of the target's graphs).
The DDTree logic they share with 0.5.17 is k26_ddtree.sglang.common (the triton backend's graph
buffer sizes among it: common/buffers.py); the algorithm is k26_ddtree.core. args, guards and
schedule_graphs import no sglang at import time, so server_args.py, model_runner.py,
cuda_graph_runner.py and triton_backend.py can import them without cycles.

One decode step, top-down:

  DFlashWorker._prepare_for_speculative_decoding   (the patched dflash_worker.py)
    newly committed target features go into the draft KV cache; the draft block
    [verified_id, MASK x (block-1)] runs once on the draft runner (its own CUDA
    graph, sized for the block). Unchanged from DFlash. Then:

  0. common/draft.py DDTreeDrafters.for_batch(bs): the drafter of this batch size's bucket
                     (one bucket without --speculative-ddtree-budget-schedule); None for a
                     chain bucket, which runs DFlash's own argmax draft and verify
  1. common/draft.py DDTreeDrafter.draft(verified_id, draft_hidden, batch) -> StepTree
                     the block's top-K log-probs through the target lm_head (vocab-sharded
                     under TP: per-shard top-K + all_gather + global log-sum-exp), then
                     the tree (core.tree.build_ddtree, budget + 1 nodes, root =
                     verified_id), its ancestor mask, positions (prefix + depth) and
                     retrieve links
  2. common/step_graphs.py
                     StepGraphs replays that fixed-shape work from the CUDA graph of the
                     smallest --cuda-graph-bs bucket holding the batch (all captured at
                     worker start-up; on one rank the lm_head and top-K are inside the
                     graph too), or runs the same functions eagerly (per schedule bucket:
                     its own batch sizes and config)
  3. ddtree_info.py  DDTreeVerifyInput.from_step (a DFlashVerifyInput): prepare_for_verify
                     allocates bs * N KV slots, assigns them to req_to_token and builds
                     the triton tree mask. The target verify forward runs unchanged: its
                     CUDA graph, logits buffer and triton buffers are sized for
                     N = budget + 1 because the target's speculative_num_draft_tokens is
                     budget + 1 (under a schedule: the largest bucket's N, and one graph
                     runner per N, schedule_graphs.py). Then verify(): accept (greedy walk in the step's verify
                     graph, or the exact tree-sampling kernel) -> record_on_requests
                     (output ids, finish, grammar, metrics, KV lengths; the one device ->
                     host copy) -> commit_on_device (the path's KV slots to req_to_token
                     in depth order, the rest freed; the path nodes' target hidden states
                     become the next draft context). Returns DFlash's 4-tuple, so the
                     worker's tail (draft KV append, sliding window, metrics) is unchanged.
  4. common/verify_utils.py
                     the maths: custom mask, slot assignment, path commit (a fused Triton
                     kernel each on CUDA, common/verify_kernels.py), target probabilities and
                     the sampling kernel call
  5. core/           tree.py, retrieve.py, verify.py: the algorithm, shape-documented
  common/trace.py    off by default (--speculative-ddtree-trace PATH, or $K26_DDTREE_TRACE):
                     the drafter keeps the top-8 on the StepTree, verify's last line records
                     it with the committed tokens; TP rank 0's TraceWriter appends, capped

Metrics: spec_verify_ct and spec_accept_length (= committed tokens per verify
step = accepted drafts + 1, as DFlash counts) keep their meaning;
spec_accept_histogram is filled per step (DFlash leaves it empty);
spec_accept_rate is accepted drafts / (verify steps * budget), i.e. the share
of verified tree nodes that were accepted.

A schedule is DDTreeSchedule (common/args.py): buckets from batch size min_bs up, each a
DDTreeConfig or the chain. Buckets capture their last batch size too
(DDTreeSchedule.graph_batch_sizes), so a padded batch stays in its bucket.

Hooks in the patched SGLang files (the diffs in patches/sglang-0.5.11/ of sglang/srt/...):
  server_args.py                the DDTree flags and fields; DDTREE in the algorithm
                                choices; args.normalize_algorithm first in __post_init__
                                (DDTREE -> DFLASH, common/args.py); args.finalize at the end of the
                                DFLASH branch of _handle_speculative_decoding
                                (validation, target/draft token split); the budget's
                                buffers added to the static-memory reserve.
  speculative/dflash_worker.py  __init__: draft args get the block (args.apply_to_draft_args),
                                block_size from args.draft_block_size, hybrid-model
                                check, the DDTreeDrafters (every step graph captured here;
                                the test-only top-K hook installed only when its
                                environment variable is set);
                                _prepare_for_speculative_decoding: the tree of the
                                batch size's bucket instead of the argmax chain.
  model_executor/model_runner.py
                                init_device_graphs: schedule_graphs.graph_runner, SGLang's
                                one runner, or under a schedule of several verify widths one
                                per width behind the same can_run / replay / bs.
  model_executor/model_runner_kv_cache_mixin.py
                                _init_pools: req_to_token rows get args.req_to_token_extra
                                columns past the context (the draft block and the tree
                                both live in the row; a small budget's tree is shorter
                                than the block).
  managers/schedule_batch.py    new_tokens_required_next_decode: the decode-memory check
                                reserves args.step_slots_per_request per request, so the
                                draft block's scratch allocation always fits.
  model_executor/cuda_graph_runner.py
                                can_run: guards.check_graph_batch (verify-width
                                mismatch -> VerifyShapeError); get_spec_info for DFLASH
                                uses the runner's own num_tokens_per_bs; a batch_sizes
                                argument restricts a runner to one bucket's sizes.
  layers/attention/triton_backend.py
                                target verify: eager builds its metadata for the input's
                                own width (guards.eager_verify_width, up to the largest);
                                capture and replay: guards.check_backend_verify_width; capture records whether the
                                graph reads the custom mask, replay refuses a step whose
                                mask presence differs (guards.check_replay_mask);
                                init_cuda_graph_state sizes its buffers with
                                common.buffers.triton_graph_sizes (per request, not per verified
                                token, for the TARGET_VERIFY-only DFlash runners).

Graph mode: the draft graph's hidden states are consumed (copied into the step
graph, or through the lm_head), the step graphs' tree, mask, positions and
packed result and the target graph's logits and hidden states are consumed
(argmax / probs, index copies) within the step that produced them, before any
of these graphs replays again. Eager mode (--disable-cuda-graph, or batches
above cuda-graph-max-bs) runs the same code with the same sizes.
"""

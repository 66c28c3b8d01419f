"""DDTree inside SGLang 0.5.11's DFlash: the code the patched SGLang files call.

This package is the only part of k26_ddtree that imports sglang (verify_input
does, at import; args, guards and buffers do not, so server_args.py,
cuda_graph_runner.py and triton_backend.py can import them without cycles).

One decode step (spec v1, no overlap scheduler), DFlashWorker.forward_batch_generation:

 1. _prepare_for_speculative_decoding: newly committed target features go into
    the draft KV cache, the draft block [verified_id, MASK x (block-1)] runs
    once in TARGET_VERIFY mode on the draft runner (its own CUDA graph, sized
    for the block). Unchanged from DFlash.
 2. draft.draft_tree: top-K tokens and log-probs per draft position from the
    draft hidden states through the target lm_head (vocab-sharded under TP:
    per-shard top-K + all_gather + global log-sum-exp), eager; the oracle
    (tests only) may rewrite them; then step_graphs.StepGraphs replays, in
    the CUDA graph of the smallest --cuda-graph-bs bucket that holds the
    batch (captured at worker start-up; eager where SGLang runs eager), the
    tree build (k26_ddtree.core.tree.build_ddtree, validate=False: one fused
    Triton kernel, budget + 1 nodes per request, root = verified_id), its
    ancestor mask and positions (prefix + depth): a StepTree.
 3. verify_input.DDTreeVerifyInput.from_step (a DFlashVerifyInput): tokens =
    the tree's nodes, positions from the StepTree; prepare_for_verify
    allocates bs * N KV slots and builds the triton custom mask from the
    StepTree's ancestor mask (per request N rows of prefix + N: prefix
    visible, then the ancestor mask).
 4. The target verify forward: unchanged call; its CUDA graph, logits buffer
    and triton buffers are sized for N = budget + 1 because the target's
    speculative_num_draft_tokens is budget + 1.
 5. DDTreeVerifyInput.verify: greedy, the argmax (eager) then the walk and
    its packing in the bucket's second graph (StepTree.greedy_packed);
    sampling, the tree sampling kernel, eager; either gives the accepted path
    and bonus in one packed tensor, copied to the host once; tokens are
    appended to each request as DFlash does; the path's KV slots are written
    to req_to_token in depth order, the rest freed; the target hidden states
    at the path nodes become the next draft context. Returns DFlash's 4-tuple, so the worker's tail (draft KV
    append, sliding window, metrics) is unchanged.

Metrics: spec_verify_ct and spec_accept_length (= committed tokens per verify
step = accepted drafts + 1, as DFlash counts) keep their meaning;
spec_accept_histogram is filled per step (DFlash leaves it empty);
spec_accept_rate is accepted drafts / (verify steps * budget), i.e. the share
of verified tree nodes that were accepted.

Hooks in the patched SGLang files (patches/sglang-0.5.11/full/sglang/srt/...):
  server_args.py                the three flags and fields; DDTREE in the algorithm
                                choices; args.normalize_algorithm first in __post_init__
                                (DDTREE -> DFLASH); args.finalize at the end of the
                                DFLASH branch of _handle_speculative_decoding
                                (validation, target/draft token split); the budget's
                                buffers added to the static-memory reserve.
  speculative/dflash_worker.py  __init__: draft args get the block (args.apply_to_draft_args),
                                block_size from args.draft_block_size, hybrid-model
                                check, oracle, the StepGraphs cache (every bucket
                                captured here);
                                _prepare_for_speculative_decoding: the tree instead of
                                the argmax chain.
  model_executor/model_runner_kv_cache_mixin.py
                                _init_pools: req_to_token rows get args.req_to_token_extra
                                columns past the context (the draft block and the tree
                                both live in the row; a small budget's tree is shorter
                                than the block).
  managers/schedule_batch.py    new_tokens_required_next_decode: the decode-memory check
                                reserves args.tokens_per_request_step per request, so the
                                draft block's scratch allocation always fits.
  model_executor/cuda_graph_runner.py
                                can_run: guards.check_graph_batch (tokens-per-request
                                mismatch -> VerifyShapeError); get_spec_info for DFLASH
                                uses the runner's own num_tokens_per_bs.
  layers/attention/triton_backend.py
                                target verify (eager, capture, replay):
                                guards.check_backend_tokens; capture records whether the
                                graph reads the custom mask, replay refuses a step whose
                                mask presence differs (guards.check_replay_mask);
                                init_cuda_graph_state sizes its buffers with
                                buffers.triton_graph_sizes (per request, not per verified
                                token, for the TARGET_VERIFY-only DFlash runners).

Graph mode: the draft graph's hidden states are consumed (lm_head matmul), the
step graphs' tree, mask, positions and packed result and the target graph's
logits and hidden states are consumed (argmax / probs, index copies) within the
step that produced them, before any of these graphs replays again. Eager mode
(--disable-cuda-graph, or batches above cuda-graph-max-bs) runs the same code
with the same sizes.
"""

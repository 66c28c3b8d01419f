"""DDTree inside SGLang's DFlash: the only part of k26_ddtree that imports sglang, the code the
patched SGLang files call. The algorithm itself is k26_ddtree.core.

  common/    the DDTree logic every version shares: args.py (the flags' meaning, defaults and
             checks, DDTreeConfig, DDTreeSchedule), draft.py (the drafter: the block's top-K
             through the target lm_head, the tree), step_graphs.py (that work replayed from one
             CUDA graph per batch-size bucket), verify_utils.py and verify_kernels.py (the
             verify's mask, slot and commit maths, fused on CUDA), trace.py (the server trace),
             buffers.py (the triton backend's CUDA-graph buffer sizes for DFlash runners)
  v0_5_11/   the wiring into 0.5.11's DFlashWorker (spec v1); its __init__.py walks the step
             and lists the hooks
  v0_5_17/   the wiring into 0.5.17's DFlashWorkerV2 (overlap on); worker.py walks the step,
             patches/sglang-0.5.17/README.md lists the hooks

One decode step, after the draft block's forward (DFlash's, unchanged):

  SGLang 0.5.11 (DFlashWorker._prepare_for_speculative_decoding, then verify)
    common/draft.py        DDTreeDrafters.for_batch -> DDTreeDrafter.draft -> StepTree
                           (common/step_graphs.py replays it)
    v0_5_11/ddtree_info.py DDTreeVerifyInput.from_step; prepare_for_verify (slots, mask);
                           the target verify forward (its graphs: v0_5_11/schedule_graphs.py,
                           guards.py, common/buffers.py); verify(): accept, record on the requests
                           (the one host copy), commit on the device

  SGLang 0.5.17 (DFlashWorkerV2.forward_batch_generation hands the step to DDTreeV2.decode)
    common/draft.py        the same drafter and StepTree
    v0_5_17/ddtree_info.py DDTreeVerifyInputV2.build (the tree padded to the verify width);
                           the target verify forward (v0_5_17/args.py sizes its graphs,
                           v0_5_17/verify_graphs.py one per width, common/buffers.py their
                           triton buffers);
                           accept, then commit on the device: no host copy, no wait
    v0_5_17/worker.py      DDTreeV2: the drafters built at start-up and the step above

Each version's args.py declares the flags on its ServerArgs, finishes their validation and splits
the token counts between target and draft; the patched files of a version import its folder.
"""

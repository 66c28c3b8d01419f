"""Guards that turn a verify-width or mask mismatch in the verify path into a clear error.

A CUDA graph and the triton backend's graph buffers are sized for one verify width,
tokens per request (the target: budget + 1 with DDTree, the block for linear DFLASH,
one runner and backend per width under a schedule; the draft: the block). Replaying
with another width reads and writes past rows that belong to other requests or to
other graphs' memory in the shared pool, which shows up much later as garbage text,
illegal addresses or CUBLAS errors. Eager verify builds its metadata per step from the
input's own width, up to the largest the server was sized for.
So a mismatch is a configuration bug and stops the step here, naming both numbers.
The guards look only at DFlash verify inputs (linear or DDTree); other
speculative algorithms keep their own conventions.

No sglang imports: cuda_graph_runner.py and triton_backend.py import this module.
"""

from __future__ import annotations


class VerifyShapeError(RuntimeError):
    """A verify batch does not match the sizes its graph or attention buffers were built for."""


def _is_dflash_verify(spec_info) -> bool:
    kind = getattr(spec_info, "spec_input_type", None)
    return getattr(kind, "name", None) == "DFLASH_VERIFY"


def check_graph_batch(role: str, verify_width: int, forward_batch) -> None:
    """CudaGraphRunner.can_run, TARGET_VERIFY batches: the batch must carry
    verify_width tokens per request, and its spec_info must say so too."""
    if not _is_dflash_verify(forward_batch.spec_info):
        return
    bs = int(forward_batch.batch_size)
    tokens = int(forward_batch.input_ids.numel())
    spec_tokens = getattr(forward_batch.spec_info, "draft_token_num", None)
    if tokens != bs * verify_width or (spec_tokens is not None and int(spec_tokens) != verify_width):
        raise VerifyShapeError(
            f"{role} verify CUDA graph is built for {verify_width} tokens per request, but the batch "
            f"has {tokens} tokens for {bs} requests (spec_info.draft_token_num={spec_tokens}); the target "
            "must verify budget + 1 tokens and the draft runner must keep the block size"
        )


def check_backend_verify_width(where: str, num_draft_tokens, spec_info) -> None:
    """TritonAttnBackend, TARGET_VERIFY: its num_draft_tokens (qo_indptr, mask rows,
    max_extend_len, graph buffers) must equal the verify input's draft_token_num."""
    if not _is_dflash_verify(spec_info):
        return
    spec_tokens = getattr(spec_info, "draft_token_num", None)
    if spec_tokens is not None and num_draft_tokens is not None and int(spec_tokens) != int(num_draft_tokens):
        raise VerifyShapeError(
            f"triton attention ({where}) is sized for {num_draft_tokens} verify tokens per request, "
            f"but the verify input has {spec_tokens}; the target's speculative_num_draft_tokens must be "
            "budget + 1 and the draft worker's the block size"
        )


def eager_verify_width(num_draft_tokens, spec_info) -> int:
    """TritonAttnBackend eager TARGET_VERIFY: the verify input's own count for a DFlash input (a
    DDTree schedule's buckets verify different counts; eager metadata is built per step), which
    must fit the largest count the server was sized for (num_draft_tokens); else the backend's."""
    spec_tokens = getattr(spec_info, "draft_token_num", None) if _is_dflash_verify(spec_info) else None
    if spec_tokens is None or num_draft_tokens is None:
        return num_draft_tokens
    if int(spec_tokens) > int(num_draft_tokens):
        raise VerifyShapeError(
            f"triton attention (eager verify) is sized for at most {num_draft_tokens} verify tokens per "
            f"request, but the verify input has {spec_tokens}; the target's speculative_num_draft_tokens "
            "must be the largest bucket's count"
        )
    return int(spec_tokens)


def check_replay_mask(captured_with_mask, spec_info) -> None:
    """TritonAttnBackend replay, TARGET_VERIFY: a graph captured with the custom mask
    reads the mask buffer at every replay, so a verify input without a mask would run
    on the previous step's mask; a graph captured without one would ignore it."""
    if captured_with_mask is None or not _is_dflash_verify(spec_info):
        return
    has_mask = getattr(spec_info, "custom_mask", None) is not None
    if captured_with_mask and not has_mask:
        raise VerifyShapeError(
            "verify CUDA graph was captured with a custom attention mask but this step has none: "
            "replaying would apply the previous step's mask"
        )
    if has_mask and not captured_with_mask:
        raise VerifyShapeError(
            "verify CUDA graph was captured without a custom attention mask, so it would ignore this "
            "step's (tree) mask"
        )

"""Sizes of the triton backend's CUDA-graph buffers for DFlash runners, in every SGLang version.

SGLang sizes them for max_num_tokens = max_bs * tokens per request, which is right for decode
graphs (one query row per token). DFlash runners (target and draft) capture TARGET_VERIFY only:
the decode buffers (attention logits, lse, kv splits) are never read, and kv_indices holds each
request's prefix once (the verified tokens' K/V come with the forward), not once per verified
token. Sized per token they grow with the budget: at budget 64, 48 requests and a 256K context,
kv_indices alone would be 6.5 GB per GPU; on 0.5.17, which raises an MLA model's kv splits
towards the SM count (256 on an H100 at that context), the decode logits of Kimi K2.6 at TP8
would be 13 GB, and a DDTree schedule's target holds one backend per verify width
(v0_5_17/verify_graphs.py). Per request they are budget-independent.

The custom mask stays per token, sized by the req_to_token width (prefix + verify block always
fits in a req_to_token row) so the longest requests cannot overflow it. 0.5.17 does not read
custom_mask: its verify mask is VerifyMask's, which the target's backend allocates for its own
width, max_context_len + width columns per verified token.

No sglang imports: triton_backend.py imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TritonGraphSizes:
    decode_rows: int  # first dim of the decode-only buffers
    kv_indices: int  # entries of cuda_graph_kv_indices
    custom_mask: int  # entries of cuda_graph_custom_mask


def triton_graph_sizes(
    verify_only: bool, max_bs: int, max_num_tokens: int, max_context_len: int, req_to_token_width: int
) -> TritonGraphSizes:
    if not verify_only:
        per_token = max_num_tokens * max_context_len
        return TritonGraphSizes(decode_rows=max_num_tokens, kv_indices=per_token, custom_mask=per_token)
    return TritonGraphSizes(
        decode_rows=max_bs,
        kv_indices=max_bs * req_to_token_width,
        custom_mask=max_num_tokens * req_to_token_width,
    )

"""The target's verify CUDA graphs under a DDTree schedule on SGLang 0.5.17: one
DecodeCudaGraphRunner per verify width.

A DecodeCudaGraphRunner captures every batch size at one width (captured_req_width, tokens per
request), and its triton backend sizes qo_indptr and the verify mask buffer for that width. A
schedule's buckets verify different widths (budget + 1 per tree bucket, the block for a chain
bucket): padding every tree to the widest would make a narrow bucket's verify cost the widest's.
So the target gets one runner per width, each capturing only its buckets' batch sizes with a
triton backend of its own (its graph buffers are what its graphs read at replay: sized per
request, common/buffers.py, and reserved per runner, args.verify_reserved_mem_mb), and a batch
runs on the runner of its verify input's width. One width (no schedule, or buckets that all
verify the same count) keeps SGLang's one runner.

The batch sizes are SGLang's (the decode graph sizes and their filters, for the runner's width)
plus the last batch size of each bucket (common.args.bucket_graph_batch_sizes), so a batch is never
padded into the next bucket's graph. The runners share SGLang's process-wide graph memory pool,
input buffer pool and logits buffer (sized for the widest width at the largest batch), as the
target and draft runners already do: one graph replays at a time and its outputs are consumed
within the step. A batch past its width's largest captured size runs eagerly, where the triton
backend plans for the verify input's own width.

No sglang imports at import time: model_runner.py imports this module.
"""

from __future__ import annotations

import functools

from k26_ddtree.sglang.common.args import bucket_graph_batch_sizes, bucket_verify_widths, is_ddtree

# cuda_graph_config.decode.backend of graphs whose attention layers run eagerly between captured
# pieces, under the model runner's forward context and its attention backend, not a width's own
# (sglang's Backend.BREAKABLE).
BREAKABLE_GRAPHS = "breakable"


def decode_graph_runner(model_runner, runner_cls):
    """ModelRunner._decode_cuda_graph_runner_cls: what SGLang calls with the model runner to build
    its decode graph runner; runner_cls itself, or for a target under a schedule of several verify
    widths a ScheduledVerifyRunner over runner_cls."""
    buckets = width_buckets(model_runner.server_args)
    if buckets is None or model_runner.is_draft_worker:
        return runner_cls
    return functools.partial(ScheduledVerifyRunner, runner_cls=runner_cls, buckets=buckets)


def width_buckets(server_args) -> list[tuple[int, int]] | None:
    """(first batch size, verify width) of each bucket (common.args.bucket_verify_widths) when the
    target gets a verify runner per width: DDTree on, several widths. None: SGLang's one runner."""
    if not is_ddtree(server_args):
        return None
    buckets = bucket_verify_widths(server_args)
    return buckets if len({width for _, width in buckets}) > 1 else None


def runner_batch_sizes(buckets: list[tuple[int, int]], sizes_for_width) -> dict[int, list[int]]:
    """{verify width: the batch sizes its runner captures}; buckets: width_buckets';
    sizes_for_width(width): SGLang's capture sizes for a runner of that width (none captured: the
    width runs eagerly)."""
    starts = [start for start, _ in buckets]
    plan = {}
    for width in {width for _, width in buckets}:
        per_bucket = bucket_graph_batch_sizes(starts, sizes_for_width(width))
        found = sorted({bs for (_, bucket_width), sizes in zip(buckets, per_bucket)
                        if bucket_width == width for bs in sizes})
        if found:
            plan[width] = found
    return plan


class ScheduledVerifyRunner:
    """The target's DecodeCudaGraphRunners, one per verify width, behind the one-runner interface
    SGLang uses (can_run_graph, load_batch, execute, bs).

    runners   {verify width: its runner}
    """

    def __init__(self, model_runner, *, runner_cls, buckets: list[tuple[int, int]]):
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        from sglang.srt.model_executor.runner.base_cuda_graph_runner import get_batch_sizes_to_capture

        if not isinstance(model_runner.attn_backend, TritonAttnBackend):
            raise RuntimeError(
                f"a DDTree schedule needs the triton attention backend, got {type(model_runner.attn_backend).__name__}"
            )
        if model_runner.server_args.cuda_graph_config.decode.backend == BREAKABLE_GRAPHS:
            raise RuntimeError(
                "a DDTree schedule of several verify widths needs full decode CUDA graphs (one attention backend "
                "per width), not breakable ones"
            )
        plan = runner_batch_sizes(buckets, lambda width: get_batch_sizes_to_capture(model_runner, width)[0])
        self.runners = {}
        self._last = None
        # Most tokens first, as SGLang captures its largest batch first: later graphs then fit in
        # the pool memory the earlier, larger ones left free.
        for width, batch_sizes in sorted(plan.items(), key=lambda item: -item[0] * item[1][-1]):
            backend = TritonAttnBackend(model_runner)
            # Sizes the verify mask buffer; the spec bag's count is the widest.
            backend.num_draft_tokens = width
            self.runners[width] = runner_cls(
                model_runner, attn_backend=backend, speculative_num_draft_tokens=width, batch_sizes=batch_sizes
            )

    def _runner(self, forward_batch):
        width = getattr(forward_batch.spec_info, "draft_token_num", None)
        return None if width is None else self.runners.get(int(width))

    def can_run_graph(self, forward_batch) -> bool:
        """False for a verify width no runner holds or a batch past its runner's sizes: eager."""
        runner = self._runner(forward_batch)
        return runner is not None and runner.can_run_graph(forward_batch)

    def load_batch(self, forward_batch, pp_proxy_tensors=None):
        self._last = self._runner(forward_batch)
        return self._last.load_batch(forward_batch, pp_proxy_tensors)

    def execute(self, forward_batch, pp_proxy_tensors=None):
        self._last = self._runner(forward_batch)
        return self._last.execute(forward_batch, pp_proxy_tensors=pp_proxy_tensors)

    @property
    def bs(self):
        """The padded batch size of the last replay, which SGLang's capturers read."""
        return getattr(self._last, "bs", None)

"""The target's verify CUDA graphs under a DDTree schedule: one SGLang CudaGraphRunner per verify width.

A SGLang CudaGraphRunner captures every batch size with one verify width (tokens per
request), and its triton backend sizes qo_indptr, the custom mask and the graph
buffers for that width. A schedule's buckets verify different widths (budget + 1
per tree bucket, the block for a chain bucket), so the target gets one runner per
width, each capturing only its buckets' batch sizes with its own triton backend
(a backend's graph buffers are what its graphs read at replay), and a batch runs
on the runner of its own width. A single width (no schedule, or buckets that
all verify the same width) keeps SGLang's one runner.

The batch sizes come from SGLang's own list (--cuda-graph-bs, its filters), plus
the last batch size of each bucket (DDTreeSchedule.graph_batch_sizes), so a batch
is never padded into the next bucket's graph. Every runner shares SGLang's global
graph memory pool and input buffers, as the target and draft runners already do:
only one graph replays at a time, and its outputs are consumed within the step.

No sglang imports at import time: model_runner.py imports this module.
"""

from __future__ import annotations

from k26_ddtree.sglang.common.args import DDTreeSchedule


def graph_runner(model_runner, runner_cls):
    """ModelRunner.init_device_graphs' graph runner: SGLang's own, or for a target under a
    schedule of several verify widths a ScheduledGraphRunner of runner_cls."""
    schedule = DDTreeSchedule.from_server_args(model_runner.server_args)
    if schedule is None or model_runner.is_draft_worker or len({b.verify_width for b in schedule.buckets}) == 1:
        return runner_cls(model_runner)
    return ScheduledGraphRunner(model_runner, runner_cls, schedule)


def runner_batch_sizes(schedule: DDTreeSchedule, sizes) -> dict[int, list[int]]:
    """{verify width: the batch sizes its runner captures} for SGLang's captured `sizes`."""
    by_width: dict[int, set[int]] = {}
    for bucket, batch_sizes in zip(schedule.buckets, schedule.graph_batch_sizes(sizes)):
        if batch_sizes:
            by_width.setdefault(bucket.verify_width, set()).update(batch_sizes)
    return {width: sorted(found) for width, found in by_width.items()}


class ScheduledGraphRunner:
    """The target's CudaGraphRunners, one per verify width, behind the one-runner interface
    ModelRunner uses (can_run, replay, bs).

    runners   {verify width: its CudaGraphRunner}
    """

    def __init__(self, model_runner, runner_cls, schedule: DDTreeSchedule):
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        from sglang.srt.model_executor.cuda_graph_runner import get_batch_sizes_to_capture

        if not isinstance(model_runner.attn_backend, TritonAttnBackend):
            raise RuntimeError(
                f"a DDTree schedule needs the triton attention backend, got {type(model_runner.attn_backend).__name__}"
            )
        sizes, _ = get_batch_sizes_to_capture(model_runner, schedule.max_verify_width)
        plan = runner_batch_sizes(schedule, sizes)
        self.runners = {}
        self._last = None
        # Most tokens first, as SGLang captures its largest batch first: later graphs then fit
        # in the pool memory the earlier, larger ones left free.
        for width, batch_sizes in sorted(plan.items(), key=lambda item: -item[0] * item[1][-1]):
            backend = TritonAttnBackend(model_runner)
            backend.num_draft_tokens = width
            self.runners[width] = runner_cls(
                model_runner, attn_backend=backend, speculative_num_draft_tokens=width, batch_sizes=batch_sizes
            )

    def _runner(self, forward_batch):
        spec_info = forward_batch.spec_info
        width = getattr(spec_info, "draft_token_num", None)
        return None if width is None else self.runners.get(int(width))

    def can_run(self, forward_batch) -> bool:
        """False for a verify width no runner holds (a bucket past every captured size): it runs eagerly."""
        runner = self._runner(forward_batch)
        return runner is not None and runner.can_run(forward_batch)

    def replay(self, forward_batch, **kwargs):
        self._last = self._runner(forward_batch)
        return self._last.replay(forward_batch, **kwargs)

    @property
    def bs(self):
        """The padded batch size of the last replay, which SGLang's metrics read."""
        return getattr(self._last, "bs", None)

"""CUDA graphs for the fixed-shape DDTree work of a decode step, one pair per batch size.

Between the draft model's graph and the target's graph a DDTree step runs the
tree build, its ancestor mask and positions, then the greedy walk and the
packing of its result: three fused kernels on CUDA and a dozen small torch
ops (a few hundred small kernels with the torch ops alone). Launched eagerly,
host dispatch would make a step CPU-bound on a fast model, so both pieces are
captured once per shape and replayed:

  draft   (root [B], top_tokens [B, D, K], top_logprobs [B, D, K], prefix_lens [B])
          -> the DDTree, its ancestor mask [B, N, N] bool, positions [B, N] long
  verify  target_next [B, N] long -> packed [B, 2 * (D + 1) + 1] long: committed
          tokens, accepted path, accept length (the one row per request the host reads),
          walked on the tree the draft graph of the same step produced.

Top-K (it has the TP all_gather), the oracle, the argmax and sampling stay eager.
As SGLang does for its own graphs, one graph pair serves a bucket of batch sizes
(the server's --cuda-graph-bs): a batch is padded up to the smallest bucket that
holds it (its rows copied in, the outputs' first B rows read back; padding rows
keep earlier valid inputs, so every row builds a valid tree). The worker
captures every bucket at start-up (capture), so no step pays for a capture or a
kernel compile; a shape not captured yet is captured on first use. The eager
path (same functions, same results) serves the CPU, servers run with
--disable-cuda-graph, batches above the largest bucket and empty batches.

WHY static outputs are safe: a replay overwrites the previous replay's outputs
of the same shape. DFlash runs spec v1 without the overlap scheduler, so draft,
target verify and commit of one step finish, in order, before the next step's
draft replays. Everything that outlives the step (committed tokens, KV slots,
hidden states, the custom mask) is copied out of these buffers within it; the
verify input holding them is dropped at the end of the step, and
batch.input_ids, a view of the tree tokens, is set anew by the next step's
prepare right after the replay.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from k26_ddtree.core.retrieve import tree_attention_mask, tree_positions
from k26_ddtree.core.tree import DDTree, build_ddtree
from k26_ddtree.core.verify import Acceptance, committed_tokens, verify_greedy

logger = logging.getLogger(__name__)


def pack_acceptance(tree: DDTree, acc: Acceptance) -> torch.Tensor:
    """[B, 2 * (D + 1) + 1] long: committed tokens (-1 padded), accepted path (-1 padded), accept length."""
    return torch.cat([committed_tokens(tree, acc), acc.path, acc.accept_len.unsqueeze(1)], dim=1)


def greedy_packed(tree: DDTree, target_next: torch.Tensor) -> torch.Tensor:
    """pack_acceptance of the greedy walk; target_next [B, N] long is the target's argmax per node."""
    return pack_acceptance(tree, verify_greedy(tree, target_next))


@dataclass
class StepTree:
    """One decode step's tree and what the target verify needs from it.

    tree       the DDTree (build_ddtree, validate=False)
    ancestor   [B, N, N] bool tree_attention_mask(tree)
    positions  [B, N] long prefix length + depth
    graphs     the captured graphs these tensors are outputs of; None when eager
    """

    tree: DDTree
    ancestor: torch.Tensor
    positions: torch.Tensor
    graphs: _ShapeGraphs | None = None

    @classmethod
    def of_tree(cls, tree: DDTree, prefix_lens: torch.Tensor) -> StepTree:
        """The eager StepTree of any tree (hand-made ones included); prefix_lens [B]."""
        return cls(tree, tree_attention_mask(tree), tree_positions(tree, prefix_lens))

    def greedy_packed(self, target_next: torch.Tensor) -> torch.Tensor:
        """greedy_packed(self.tree, target_next); from a graph, a static buffer valid until the next step."""
        if self.graphs is None:
            return greedy_packed(self.tree, target_next)
        return self.graphs.verify(target_next)


def eager_step(
    root: torch.Tensor,
    top_tokens: torch.Tensor,
    top_logprobs: torch.Tensor,
    prefix_lens: torch.Tensor,
    budget: int,
    spine: bool,
) -> StepTree:
    """The draft piece run eagerly: what a graph replay gives, from the same functions."""
    tree = build_ddtree(root, top_tokens, top_logprobs, budget, spine=spine, validate=False)
    return StepTree.of_tree(tree, prefix_lens)


class _ShapeGraphs:
    """The draft and verify graphs of one (bucket, D, K, budget, spine), with their static buffers."""

    def __init__(self, bucket: int, depth: int, topk: int, budget: int, spine: bool, device, pool):
        self.root, self.top_tokens, self.top_logprobs, self.prefix_lens, self.target_next = self.inputs(
            bucket, depth, topk, budget, device
        )

        def draft() -> StepTree:
            return eager_step(self.root, self.top_tokens, self.top_logprobs, self.prefix_lens, budget, spine)

        # Warm-up on a side stream, as capture requires; it also makes build_ddtree's
        # per-shape device constants, which must exist before capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            greedy_packed(draft().tree, self.target_next)
        torch.cuda.current_stream(device).wait_stream(side)

        # thread_local: the worker's process has other threads; a CUDA call from one of
        # them must neither fail nor invalidate this capture.
        self.draft_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.draft_graph, pool=pool, capture_error_mode="thread_local"):
            step = draft()
        self.tree, self.ancestor, self.positions = step.tree, step.ancestor, step.positions
        self.verify_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.verify_graph, pool=pool, capture_error_mode="thread_local"):
            self.packed = greedy_packed(self.tree, self.target_next)

    @staticmethod
    def inputs(bucket: int, depth: int, topk: int, budget: int, device) -> tuple[torch.Tensor, ...]:
        """Static inputs (root, top_tokens, top_logprobs, prefix_lens, target_next) holding a
        valid step (log-probs descending, <= 0) until real rows are copied in."""
        return (
            torch.zeros(bucket, dtype=torch.long, device=device),
            torch.zeros(bucket, depth, topk, dtype=torch.long, device=device),
            -torch.arange(topk, dtype=torch.float32, device=device).expand(bucket, depth, topk).clone(),
            torch.zeros(bucket, dtype=torch.long, device=device),
            torch.zeros(bucket, budget + 1, dtype=torch.long, device=device),
        )

    def draft(self, root, top_tokens, top_logprobs, prefix_lens) -> StepTree:
        batch = top_tokens.shape[0]
        if top_tokens.dtype != torch.long:
            raise ValueError(f"top_tokens must be torch.long, got {top_tokens.dtype}")
        self.batch = batch
        self.root[:batch].copy_(root)
        self.top_tokens[:batch].copy_(top_tokens)
        self.top_logprobs[:batch].copy_(top_logprobs)
        self.prefix_lens[:batch].copy_(prefix_lens)
        self.draft_graph.replay()
        t = self.tree
        tree = DDTree(
            t.tokens[:batch], t.parents[:batch], t.depths[:batch], t.node_logws[:batch], t.max_depth, t.best_first
        )
        return StepTree(tree, self.ancestor[:batch], self.positions[:batch], self)

    def verify(self, target_next: torch.Tensor) -> torch.Tensor:
        want = (self.batch, self.target_next.shape[1])
        if tuple(target_next.shape) != want or target_next.dtype != torch.long:
            raise ValueError(
                f"target_next must be {list(want)} torch.long, got {list(target_next.shape)} {target_next.dtype}"
            )
        self.target_next[: self.batch].copy_(target_next)
        self.verify_graph.replay()
        return self.packed[: self.batch]


class StepGraphs:
    """Per-shape cache of the DDTree step graphs of one worker (one per TP rank).

    buckets: the batch sizes captured; a batch runs in the smallest bucket that holds
    it; larger batches, and every batch when there are no buckets, run eagerly.
    """

    def __init__(self, buckets):
        self.buckets = sorted({int(b) for b in buckets if int(b) > 0})
        self._graphs: dict[tuple, _ShapeGraphs] = {}
        self._pool = None

    @property
    def max_bs(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    @classmethod
    def for_server(cls, server_args, device) -> StepGraphs:
        """Graphs exactly where SGLang replays its own: CUDA, graphs on, its --cuda-graph-bs
        (filled in by ServerArgs), up to the first that holds --max-running-requests."""
        if torch.device(device).type != "cuda" or server_args.disable_cuda_graph:
            return cls([])
        buckets = sorted(server_args.cuda_graph_bs or [int(server_args.cuda_graph_max_bs or 0)])
        cap = server_args.max_running_requests
        if cap:
            buckets = [b for b in buckets if b < cap] + [b for b in buckets if b >= cap][:1]
        return cls(buckets)

    def capture(self, depth: int, topk: int, budget: int, spine: bool, device) -> None:
        """Capture every bucket of one tree shape now (at start-up) rather than on first use.
        Without buckets off the CPU (--disable-cuda-graph on a GPU), run one eager step
        instead, so the fused kernels compile here and not in the first decode step."""
        device = torch.device(device)
        for bucket in self.buckets:
            self._shape(bucket, depth, topk, budget, spine, device)
        if not self.buckets and device.type != "cpu":
            warm = _ShapeGraphs.inputs(1, depth, topk, budget, device)
            greedy_packed(eager_step(*warm[:4], budget, spine).tree, warm[4])

    @property
    def captured(self) -> int:
        """How many shapes have their graphs."""
        return len(self._graphs)

    def draft(
        self,
        root: torch.Tensor,
        top_tokens: torch.Tensor,
        top_logprobs: torch.Tensor,
        prefix_lens: torch.Tensor,
        budget: int,
        spine: bool,
    ) -> StepTree:
        """root [B], top_tokens [B, D, K] long, top_logprobs [B, D, K] float, prefix_lens [B]
        -> this step's StepTree (static buffers when replayed from a graph)."""
        batch, depth, topk = top_tokens.shape
        if not (top_tokens.is_cuda and 0 < batch <= self.max_bs):
            return eager_step(root.to(torch.long), top_tokens, top_logprobs, prefix_lens, budget, spine)
        bucket = next(b for b in self.buckets if b >= batch)
        graphs = self._shape(bucket, depth, topk, budget, spine, top_tokens.device)
        return graphs.draft(root, top_tokens, top_logprobs, prefix_lens)

    def _shape(self, bucket: int, depth: int, topk: int, budget: int, spine: bool, device) -> _ShapeGraphs:
        # Buffers take the caller's grad mode: made at start-up they are ordinary tensors,
        # which steps under no_grad or inference mode (SGLANG_ENABLE_TORCH_INFERENCE_MODE)
        # may both write in place; one made lazily inside a step matches that step's mode,
        # which SGLang keeps for every step.
        key = (bucket, depth, topk, budget, spine)
        graphs = self._graphs.get(key)
        if graphs is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graphs = _ShapeGraphs(bucket, depth, topk, budget, spine, device, self._pool)
            self._graphs[key] = graphs
            logger.info("DDTree step graphs captured for batch size %d (%d captured).", bucket, self.captured)
        return graphs

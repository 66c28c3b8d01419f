"""CUDA graphs of a DDTree step's fixed-shape work, one pair per batch-size bucket.

Between the draft model's graph and the target's graph a DDTree step runs:

  draft   from the draft hidden states [B, D, H] (one rank: lm_head, top-K and log-sum-exp
          inside the graph) or from the merged top-K tokens and log-probs [B, D, K] (under
          TP, or with a top-K hook), with the roots [B] and prefix lengths [B]
          -> StepTree: the DDTree, its ancestor mask [B, N, N], positions [B, N] and the
             first-child / next-sibling links [B, N] the sampling kernel walks
  verify  the target's argmax after every node, written straight into the graph's input
          -> PackedAcceptance of the greedy walk [B, 2 * (D + 1) + 1], the one row per
             request the host reads

Launched eagerly that is a few dozen small kernels (a few hundred with the torch
ops alone), and host dispatch would make a step CPU-bound on a fast model, so
both pieces are captured once per shape and replayed. As SGLang does for its
own graphs, one graph pair serves a bucket of batch sizes (the server's
--cuda-graph-bs): a batch is padded up to the smallest bucket that holds it
(its rows copied in, the outputs' first B rows read back; padding rows keep
earlier valid inputs, so every row builds a valid tree). Every bucket is
captured at worker start-up (capture), so no step pays for a capture or a
kernel compile. The eager path (same functions, same results) serves the CPU,
servers run with --disable-cuda-graph, batches above the largest bucket and
empty batches.

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
from typing import Sequence

import torch

from k26_ddtree.core.retrieve import compile_ddtree_retrieve, tree_attention_mask, tree_positions
from k26_ddtree.core.tree import DDTree, build_ddtree
from k26_ddtree.core.verify import PackedAcceptance, verify_greedy
from k26_ddtree.sglang.common.args import DDTreeConfig
from k26_ddtree.sglang.common.trace import StepDraft

logger = logging.getLogger(__name__)


@dataclass
class StepTree:
    """One decode step's tree and what the target verify needs from it.

    tree          the DDTree (build_ddtree, validate=False)
    ancestor      [B, N, N] bool tree_attention_mask(tree)
    positions     [B, N] long prefix length + depth
    retrieve      compile_ddtree_retrieve(tree): index, next_token, next_sibling, each [B, N] long
    graphs        the bucket graphs these tensors are outputs of; None when eager
    trace         the drafter's top-8 for the server trace, recorded once the step commits;
                  None when not tracing (and on TP ranks other than 0)
    """

    tree: DDTree
    ancestor: torch.Tensor
    positions: torch.Tensor
    retrieve: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    graphs: _BucketGraphs | None = None
    trace: StepDraft | None = None

    @classmethod
    def of_tree(cls, tree: DDTree, prefix_lens: torch.Tensor) -> StepTree:
        """The eager StepTree of any tree (hand-made ones included); prefix_lens [B]."""
        return cls(tree, tree_attention_mask(tree), tree_positions(tree, prefix_lens), compile_ddtree_retrieve(tree))

    def first(self, rows: int, graphs: _BucketGraphs | None = None) -> StepTree:
        """This step's first `rows` requests (views): a padded bucket's real rows."""
        t = self.tree
        tree = DDTree(t.tokens[:rows], t.parents[:rows], t.depths[:rows], t.node_logws[:rows], t.max_depth, t.best_first)
        return StepTree(tree, self.ancestor[:rows], self.positions[:rows], tuple(r[:rows] for r in self.retrieve), graphs)

    def accept_greedy(self, logits: torch.Tensor) -> PackedAcceptance:
        """The greedy walk on this tree; logits [B * N, V] are the target's after every node.
        From a graph the rows are a static buffer, valid until the next step."""
        if self.graphs is None:
            return greedy_acceptance(self.tree, torch.argmax(logits, dim=-1).view(self.tree.tokens.shape))
        return self.graphs.replay_accept(logits)


def greedy_acceptance(tree: DDTree, target_next: torch.Tensor) -> PackedAcceptance:
    """The packed greedy walk; target_next [B, N] long, the target's argmax after every node."""
    return PackedAcceptance.pack(tree, verify_greedy(tree, target_next))


def tree_step(config: DDTreeConfig, root: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor,
              prefix_lens: torch.Tensor) -> StepTree:
    """The draft piece from the merged top-K: root [B] long, top_tokens / top_logprobs [B, D, K],
    prefix_lens [B]."""
    tree = build_ddtree(root, top_tokens, top_logprobs, config.budget, spine=config.spine, validate=False)
    return StepTree.of_tree(tree, prefix_lens)


def hidden_step(config: DDTreeConfig, head, root: torch.Tensor, hidden: torch.Tensor,
                prefix_lens: torch.Tensor) -> StepTree:
    """The draft piece from the draft hidden states [B, D, H] on one rank: head.topk_per_depth
    (draft.DraftHead: lm_head, top-K, log-sum-exp) then tree_step."""
    return tree_step(config, root, *head.topk_per_depth(hidden, config.topk), prefix_lens)


def placeholder_inputs(config: DDTreeConfig, rows: int, head, device: torch.device) -> dict[str, torch.Tensor]:
    """The draft piece's inputs past the roots and prefix lengths (hidden states with a one-rank
    head, else the merged top-K), holding a valid step (log-probs descending, <= 0; any hidden)."""
    depth, topk = config.block_size - 1, config.topk
    if head is not None:
        return {"hidden": torch.zeros(rows, depth, head.weight.shape[1], dtype=head.weight.dtype, device=device)}
    logprobs = -torch.arange(topk, dtype=torch.float32, device=device).expand(rows, depth, topk).clone()
    return {"top_tokens": torch.zeros(rows, depth, topk, dtype=torch.long, device=device), "top_logprobs": logprobs}


def draft_piece(config: DDTreeConfig, head, root: torch.Tensor, inputs: dict[str, torch.Tensor],
                prefix_lens: torch.Tensor) -> StepTree:
    """hidden_step or tree_step, whichever `inputs` (placeholder_inputs' keys) are for."""
    if head is not None:
        return hidden_step(config, head, root, inputs["hidden"], prefix_lens)
    return tree_step(config, root, inputs["top_tokens"], inputs["top_logprobs"], prefix_lens)


def _copy_rows(name: str, static: torch.Tensor, got: torch.Tensor) -> None:
    """static[:B] = got, refusing what a broadcasting copy would silently accept."""
    if tuple(got.shape[1:]) != tuple(static.shape[1:]) or got.dtype.is_floating_point != static.dtype.is_floating_point:
        raise ValueError(
            f"{name} must be [B, {', '.join(map(str, static.shape[1:]))}] {static.dtype}, "
            f"got {list(got.shape)} {got.dtype}"
        )
    static[: got.shape[0]].copy_(got)


class _BucketGraphs:
    """The draft and verify graphs of one batch-size bucket, with their static buffers."""

    def __init__(self, config: DDTreeConfig, bucket: int, head, device: torch.device, pool):
        self.root = torch.zeros(bucket, dtype=torch.long, device=device)
        self.prefix_lens = torch.zeros(bucket, dtype=torch.long, device=device)
        self.inputs = placeholder_inputs(config, bucket, head, device)
        self.target_next = torch.zeros(bucket, config.budget + 1, dtype=torch.long, device=device)

        def build() -> StepTree:
            return draft_piece(config, head, self.root, self.inputs, self.prefix_lens)

        # Warm-up on a side stream, as capture requires; it also makes build_ddtree's
        # per-shape device constants and compiles the kernels, which must happen before capture.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            greedy_acceptance(build().tree, self.target_next)
        torch.cuda.current_stream(device).wait_stream(side)

        # thread_local: the worker's process has other threads; a CUDA call from one of
        # them must neither fail nor invalidate this capture.
        self.draft_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.draft_graph, pool=pool, capture_error_mode="thread_local"):
            self.step = build()
        self.verify_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.verify_graph, pool=pool, capture_error_mode="thread_local"):
            self.packed = greedy_acceptance(self.step.tree, self.target_next).rows
        self.rows = 0  # requests of the step replayed last

    def replay_draft(self, root: torch.Tensor, prefix_lens: torch.Tensor, **inputs: torch.Tensor) -> StepTree:
        batch = root.shape[0]
        for name, got in inputs.items():
            _copy_rows(name, self.inputs[name], got)
        self.root[:batch].copy_(root)
        self.prefix_lens[:batch].copy_(prefix_lens)
        self.draft_graph.replay()
        self.rows = batch
        return self.step.first(batch, self)

    def replay_accept(self, logits: torch.Tensor) -> PackedAcceptance:
        """The greedy walk on the trees of the last draft replay; logits [rows * N, V]."""
        want = self.rows * self.target_next.shape[1]
        if logits.dim() != 2 or logits.shape[0] != want:
            raise ValueError(f"logits must be [{want}, V] for the step's {self.rows} trees, got {list(logits.shape)}")
        torch.argmax(logits, dim=-1, out=self.target_next[: self.rows].view(-1))
        self.verify_graph.replay()
        return PackedAcceptance(self.packed[: self.rows])


class StepGraphs:
    """The DDTree step graphs of one worker (one per TP rank), per batch-size bucket.

    config     the DDTreeConfig every graph is built for
    buckets    the batch sizes captured; a batch runs in the smallest bucket that holds it;
               larger batches, and every batch when there are no buckets, run eagerly
    head       a one-rank draft.DraftHead: the draft graph then starts from the draft hidden
               states (draft_from_hidden); None: from the merged top-K (draft)
    max_batch  the largest batch the server runs (its --max-running-requests), for the
               start-up compile of the verify kernels; default the largest bucket
    """

    def __init__(self, config: DDTreeConfig, buckets: Sequence[int], head=None, device="cpu",
                 max_batch: int | None = None):
        self.config = config
        self.buckets = sorted({int(b) for b in buckets if int(b) > 0})
        self.head = head
        self.device = torch.device(device)
        self.max_batch = int(max_batch or self.max_bs or 1)
        self._graphs: dict[int, _BucketGraphs] = {}
        self._pool = None

    @property
    def owns_topk(self) -> bool:
        return self.head is not None

    @property
    def max_bs(self) -> int:
        return self.buckets[-1] if self.buckets else 0

    @property
    def captured(self) -> int:
        """How many buckets have their graphs."""
        return len(self._graphs)

    @staticmethod
    def server_batch_sizes(server_args, device) -> list[int]:
        """The batch sizes to capture where SGLang replays its own graphs: CUDA, graphs on, its
        --cuda-graph-bs (filled in by ServerArgs), up to the first that holds
        --max-running-requests (DFLASH always sets it); none otherwise."""
        if torch.device(device).type != "cuda" or server_args.disable_cuda_graph:
            return []
        sizes = sorted(server_args.cuda_graph_bs or [int(server_args.cuda_graph_max_bs or 0)])
        cap = server_args.max_running_requests
        if cap:
            sizes = [b for b in sizes if b < cap] + [b for b in sizes if b >= cap][:1]
        return sizes

    def capture(self) -> None:
        """Capture every bucket now (at start-up) rather than on first use. Without buckets
        off the CPU (--disable-cuda-graph on a GPU), run one eager step instead, so the
        fused kernels compile here and not in the first decode step; on CUDA compile the
        verify's kernels for these batch sizes too."""
        # Largest first, as SGLang captures: a smaller bucket's graph then fits in the memory the
        # larger one's intermediates (the lm_head logits above all) left free in the shared pool.
        for bucket in reversed(self.buckets):
            self._bucket(bucket)
        if self.device.type == "cuda":
            from k26_ddtree.sglang.common import verify_kernels

            verify_kernels.warm_up(self.config.budget + 1, self.config.block_size - 1, self.max_batch, self.device)
        if not self.buckets and self.device.type != "cpu":
            root = torch.zeros(1, dtype=torch.long, device=self.device)
            inputs = placeholder_inputs(self.config, 1, self.head, self.device)
            step = draft_piece(self.config, self.head, root, inputs, root)
            step.accept_greedy(torch.zeros(self.config.budget + 1, 2, device=self.device))

    def draft(self, root: torch.Tensor, top_tokens: torch.Tensor, top_logprobs: torch.Tensor,
              prefix_lens: torch.Tensor) -> StepTree:
        """root [B], top_tokens [B, D, K] long, top_logprobs [B, D, K] float, prefix_lens [B]
        -> this step's StepTree (static buffers when replayed from a graph)."""
        graphs = None if self.owns_topk else self._graphs_for(top_tokens)
        if graphs is None:
            return tree_step(self.config, root.to(torch.long), top_tokens, top_logprobs, prefix_lens)
        return graphs.replay_draft(root, prefix_lens, top_tokens=top_tokens, top_logprobs=top_logprobs)

    def draft_from_hidden(self, root: torch.Tensor, hidden: torch.Tensor, prefix_lens: torch.Tensor) -> StepTree:
        """root [B], hidden [B, D, H] (the draft block's hidden states past the root),
        prefix_lens [B] -> this step's StepTree; needs the one-rank head."""
        graphs = self._graphs_for(hidden)
        if graphs is None:
            return hidden_step(self.config, self.head, root.to(torch.long), hidden, prefix_lens)
        return graphs.replay_draft(root, prefix_lens, hidden=hidden)

    def _graphs_for(self, batch_input: torch.Tensor) -> _BucketGraphs | None:
        batch = batch_input.shape[0]
        if not (batch_input.is_cuda and 0 < batch <= self.max_bs):
            return None
        return self._bucket(next(b for b in self.buckets if b >= batch))

    def _bucket(self, bucket: int) -> _BucketGraphs:
        # Buffers take the caller's grad mode: made at start-up they are ordinary tensors,
        # which steps under no_grad or inference mode (SGLANG_ENABLE_TORCH_INFERENCE_MODE)
        # may both write in place; one made lazily inside a step matches that step's mode,
        # which SGLang keeps for every step.
        graphs = self._graphs.get(bucket)
        if graphs is None:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graphs = _BucketGraphs(self.config, bucket, self.head, self.device, self._pool)
            self._graphs[bucket] = graphs
            logger.info("DDTree step graphs captured for batch size %d (%d captured).", bucket, self.captured)
        return graphs

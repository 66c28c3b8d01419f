"""Walk a DDTree against the target model's output: which draft tokens are accepted.

Both walks start at the root and take one step per depth for the whole batch
at once (a loop over depth, never over requests or nodes). At the current node
the target proposes a token (its argmax, or a sample); if a child of the node
carries it the walk descends there, otherwise the proposal is the bonus token
and the walk stops. Sampling this way ("sample-and-match") commits tokens with
exactly the target's autoregressive law, because the draft children are fixed
candidates, not samples from a draft distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from k26_ddtree.core.fused import fused_kernel
from k26_ddtree.core.tree import DDTree


@dataclass
class Acceptance:
    """Outcome of verifying a batch of trees.

    accept_len [B] long        draft tokens accepted (0..D)
    path       [B, D + 1] long accepted local node indices, root first, -1 padded
    next_token [B] long        the bonus token, proposed by the target after the last accepted node
    """

    accept_len: torch.Tensor
    path: torch.Tensor
    next_token: torch.Tensor


def committed_tokens(tree: DDTree, acc: Acceptance) -> torch.Tensor:
    """[B, D + 1] long: the accepted draft tokens then the bonus token, -1 padded."""
    accepted = tree.tokens.gather(1, acc.path[:, 1:].clamp(min=0))
    width = accepted.shape[1]
    slot = torch.arange(width + 1, device=accepted.device).expand(acc.path.shape[0], width + 1)
    padded = torch.cat([accepted, accepted[:, :1]], dim=1)
    length = acc.accept_len.unsqueeze(1)
    return torch.where(slot < length, padded, torch.where(slot == length, acc.next_token.unsqueeze(1), -1))


@dataclass(frozen=True)
class PackedAcceptance:
    """A batch's Acceptance with its committed tokens in one [B, 2 * (D + 1) + 1] long tensor,
    so the host reads the whole outcome of a step with one device -> host copy.

    rows[:, 0 : D + 1]        committed tokens: accepted drafts then the bonus, -1 padded
    rows[:, D + 1 : 2D + 2]   accepted path, local node indices, root first, -1 padded
    rows[:, 2D + 2]           accept length (accepted drafts)
    """

    rows: torch.Tensor

    @classmethod
    def pack(cls, tree: DDTree, acc: Acceptance) -> PackedAcceptance:
        return cls(torch.cat([committed_tokens(tree, acc), acc.path, acc.accept_len.unsqueeze(1)], dim=1))

    @property
    def width(self) -> int:
        """D + 1: the longest committed run (and path) of one request."""
        return (self.rows.shape[1] - 1) // 2

    @property
    def path(self) -> torch.Tensor:
        """[B, D + 1] the accepted paths (a view, on the rows' device)."""
        return self.rows[:, self.width : 2 * self.width]

    def committed_on_host(self) -> list[list[int]]:
        """Each request's committed tokens (accepted drafts then the bonus): the one
        device -> host copy of a step."""
        return [row[: row[-1] + 1] for row in self.rows.cpu().tolist()]


def _child_carrying(tree: DDTree, node: torch.Tensor, token: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(found [B] bool, child [B] long): the first child of `node` whose token is `token`."""
    match = (tree.parents == node.unsqueeze(1)) & (tree.tokens == token.unsqueeze(1))
    return match.any(dim=1), match.to(torch.uint8).argmax(dim=1)


def _walk(tree: DDTree, propose) -> Acceptance:
    """propose(node [B]) -> token [B] the target offers at each current node."""
    batch = tree.batch_size
    device = tree.tokens.device
    node = torch.zeros(batch, dtype=torch.long, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    accept_len = torch.zeros(batch, dtype=torch.long, device=device)
    next_token = torch.zeros(batch, dtype=torch.long, device=device)
    steps = [node]
    for _ in range(tree.depth_cap()):
        token = propose(node)
        found, child = _child_carrying(tree, node, token)
        found &= active
        next_token = torch.where(active & ~found, token, next_token)
        node = torch.where(found, child, node)
        accept_len += found
        steps.append(torch.where(found, child, -1))
        active = found
    # A walk still going sits at the depth cap: its node has no children.
    next_token = torch.where(active, propose(node), next_token)
    return Acceptance(accept_len=accept_len, path=torch.stack(steps, dim=1), next_token=next_token)


def _check_tree_batch(tree: DDTree, name: str, t: torch.Tensor, dims: int) -> None:
    if t.dim() != dims or tuple(t.shape[:2]) != tuple(tree.tokens.shape):
        want = "[B, N]" if dims == 2 else "[B, N, V]"
        raise ValueError(
            f"{name} must be {want} with [B, N] = {tuple(tree.tokens.shape)}, got shape {tuple(t.shape)}"
        )
    if t.device != tree.tokens.device:
        raise ValueError(f"{name} is on {t.device} but the tree is on {tree.tokens.device}")


def verify_greedy(tree: DDTree, target_next: torch.Tensor, *, fused: bool | None = None) -> Acceptance:
    """Greedy verification; target_next [B, N] long is the target's argmax after each node.

    fused: whether the fused Triton walk (walk_kernel.py) runs instead of the torch
    ops; None (default) runs it for CUDA tensors (k26_ddtree.core.fused).
    """
    _check_tree_batch(tree, "target_next", target_next, 2)
    if target_next.dtype != torch.long:
        raise ValueError(f"target_next must be torch.long, got {target_next.dtype}")
    kernel = fused_kernel(fused, target_next, tree.verify_width, "core.walk_kernel", "verify_greedy_fused")
    if kernel is not None:
        return kernel(tree, target_next)
    return _walk(tree, lambda node: target_next.gather(1, node.unsqueeze(1)).squeeze(1))


def verify_along(tree: DDTree, continuation: torch.Tensor) -> Acceptance:
    """Greedy verification when the target's greedy continuation is already known (a recorded
    or reference output): continuation [B, D + 1] long, continuation[b, d] the target's token
    after the depth-d node of the true path (column 0: after the root).

    The walk only ever stands on nodes of the true path, where the target's argmax is
    continuation[depth], so this equals verify_greedy on the real target: the tokens a tree
    of this shape would have committed, without running the target.
    """
    if continuation.dim() != 2 or continuation.shape[0] != tree.batch_size:
        raise ValueError(f"continuation must be [B, D + 1] with B = {tree.batch_size}, got {tuple(continuation.shape)}")
    if continuation.shape[1] <= tree.depth_cap():
        raise ValueError(f"continuation needs D + 1 = {tree.depth_cap() + 1} columns, got {continuation.shape[1]}")
    return verify_greedy(tree, continuation.long().gather(1, tree.depths))


def verify_sampling(
    tree: DDTree, target_probs: torch.Tensor, generator: torch.Generator | None = None
) -> Acceptance:
    """Sample-and-match verification; target_probs [B, N, V] is the target's next-token
    law after each node, already shaped by temperature / top-k / top-p.

    Every visited node gets its own fresh draw, so the committed tokens follow
    the target's autoregressive law whatever the tree.
    """
    _check_tree_batch(tree, "target_probs", target_probs, 3)
    if not target_probs.dtype.is_floating_point:
        raise ValueError(f"target_probs must be a floating-point tensor, got {target_probs.dtype}")
    vocab = target_probs.shape[2]

    def draw(node: torch.Tensor) -> torch.Tensor:
        probs = target_probs.gather(1, node.view(-1, 1, 1).expand(-1, 1, vocab)).squeeze(1)
        return torch.multinomial(probs.float(), 1, generator=generator).squeeze(1)

    return _walk(tree, draw)

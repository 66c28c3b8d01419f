"""Slow, obviously-correct versions of the DDTree core, one request at a time.

They define what the batched code in tree.py and verify.py must compute, and
the tests and the benchmark compare against them. Plain Python on lists:
scores are summed in float32 exactly like the batched builder (a float64 sum
of two float32 values rounded once to float32 is the correctly rounded float32
sum), so ties are the same ties.
"""

from __future__ import annotations

import heapq
import itertools
import struct

import torch

from k26_ddtree.core.tree import DDTree


def _f32(x: float) -> float:
    return struct.unpack("f", struct.pack("f", x))[0]


def _order_key(path: tuple[int, ...], score: float, spine_len: int):
    on_spine = len(path) <= spine_len and not any(path)
    return (not on_spine, -score, len(path), path)


def _pack(rows: list[list[tuple]], depth: int) -> DDTree:
    """rows[b] = [(path, score, parent_index, token)] in node order, root first."""

    def column(i, dtype):
        return torch.tensor([[node[i] for node in row] for row in rows], dtype=dtype)

    depths = torch.tensor([[len(node[0]) for node in row] for row in rows], dtype=torch.long)
    return DDTree(
        tokens=column(3, torch.long),
        parents=column(2, torch.long),
        depths=depths,
        node_logws=column(1, torch.float32),
        max_depth=depth,
        best_first=True,
    )


def heap_ddtree(root_tokens, top_tokens, top_logprobs, budget: int, *, spine: bool = False) -> DDTree:
    """Best-first heap, as in the DDTree paper's reference code.

    Popping a prefix adds it to the tree and pushes its next sibling (same
    parent, next rank) and its first child (next depth, rank 0). Both have a
    worse key than the popped prefix, and every prefix is pushed by one of
    them, so pops come out in key order.
    """
    _, depth, topk = top_tokens.shape
    spine_len = min(depth, budget) if spine else 0
    rows = []
    for b in range(top_tokens.shape[0]):
        lp = top_logprobs[b].float().tolist()
        tok = top_tokens[b].tolist()
        nodes = [((), 0.0, -1, int(root_tokens[b]))]
        index_of = {(): 0}
        score_of = {(): 0.0}
        heap = []

        def push(path):
            score = _f32(score_of[path[:-1]] + lp[len(path) - 1][path[-1]])
            heapq.heappush(heap, (_order_key(path, score, spine_len), path, score))

        push((0,))
        while len(nodes) <= budget:
            _, path, score = heapq.heappop(heap)
            index_of[path] = len(nodes)
            score_of[path] = score
            nodes.append((path, score, index_of[path[:-1]], tok[len(path) - 1][path[-1]]))
            if path[-1] + 1 < topk:
                push(path[:-1] + (path[-1] + 1,))
            if len(path) < depth:
                push(path + (0,))
        rows.append(nodes)
    return _pack(rows, depth)


def _score_of(path: tuple[int, ...], lp) -> float:
    score = 0.0
    for d, r in enumerate(path):
        score = _f32(score + lp[d][r])
    return score


def enumerate_ddtree(root_tokens, top_tokens, top_logprobs, budget: int, *, spine: bool = False) -> DDTree:
    """Score every one of the sum K^d prefixes and keep the best `budget`: for small D and K only."""
    _, depth, topk = top_tokens.shape
    spine_len = min(depth, budget) if spine else 0
    rows = []
    for b in range(top_tokens.shape[0]):
        lp = top_logprobs[b].float().tolist()
        tok = top_tokens[b].tolist()
        prefixes = [
            path for d in range(1, depth + 1) for path in itertools.product(range(topk), repeat=d)
        ]
        ranked = sorted(prefixes, key=lambda p: _order_key(p, _score_of(p, lp), spine_len))[:budget]
        index_of = {(): 0}
        nodes = [((), 0.0, -1, int(root_tokens[b]))]
        for path in ranked:
            index_of[path] = len(nodes)
            nodes.append((path, _score_of(path, lp), index_of[path[:-1]], tok[len(path) - 1][path[-1]]))
        rows.append(nodes)
    return _pack(rows, depth)


def children_of(tree: DDTree, b: int) -> dict[int, list[int]]:
    """Children of every node of request b, best (highest node_logws) first."""
    parents = tree.parents[b].tolist()
    logws = tree.node_logws[b].tolist()
    kids: dict[int, list[int]] = {i: [] for i in range(len(parents))}
    for i, p in enumerate(parents):
        if p >= 0:
            kids[p].append(i)
    for p in kids:
        kids[p].sort(key=lambda i: (-logws[i], i))
    return kids


def walk_greedy(tree: DDTree, target_next) -> list[tuple[list[int], int]]:
    """Per request: (accepted path of local node indices, root first; bonus token)."""
    out = []
    for b in range(tree.batch_size):
        kids = children_of(tree, b)
        tokens = tree.tokens[b].tolist()
        wanted = target_next[b].tolist()
        path = [0]
        while True:
            match = [c for c in kids[path[-1]] if tokens[c] == wanted[path[-1]]]
            if not match:
                break
            path.append(match[0])
        out.append((path, wanted[path[-1]]))
    return out

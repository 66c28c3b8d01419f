"""Test-only oracle drafter: rewrites the draft top-K so acceptance is high and every commit path runs.

Installed by the DDTree worker as its top-K hook when K26_DDTREE_TOPK_HOOK names HOOK
(k26_ddtree.sglang.common.draft loads it by that dotted path) and K26_DDTREE_ORACLE names a JSON file:

    {"prompts": [{"input_ids": [...], "ar_output_ids": [...]}, ...], "seed": int}

ar_output_ids is what an autoregressive run of the same target produced for
that prompt. For a request whose prompt matches and whose output so far is
still a prefix of that AR output, each draft step puts the AR continuation
into the top-K: at draft position d the AR token after the root's d - 1
successors is placed at rank 0, at a rank 1..K-1, or left out, chosen
deterministically from (seed, prompt, output length, d). Log-probs are
replaced by a fixed descending ladder, so the tree shape depends only on
budget/topk: deep chains, non-first siblings, partial and full-depth
acceptance all occur. The real drafter's candidates fill the other ranks.
Other requests keep the real draft. Verification is untouched, so output
stays exact whatever the oracle does.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch

ENV_VAR = "K26_DDTREE_ORACLE"
# The value of k26_ddtree.sglang.common.draft.TOPK_HOOK_ENV that installs this oracle.
HOOK = "proving_ground.oracle:topk_hook"

# Chance of each placement of the AR token at one draft position.
P_RANK0 = 0.75
P_SIBLING = 0.2  # rank 1..K-1 (rank 0 instead when K == 1)
# Log-prob of rank r: a ladder steep enough that rank-0 chains come first.
LADDER_TOP = -0.05
LADDER_STEP = 0.7

PLACE_ABSENT = -1


class OracleError(ValueError):
    """The oracle file named by K26_DDTREE_ORACLE is missing or malformed."""


class Oracle:
    def __init__(self, prompts: list[dict], seed: int):
        self.seed = int(seed)
        self._by_prompt: dict[tuple[int, ...], tuple[int, list[int]]] = {}
        for index, prompt in enumerate(prompts):
            self._by_prompt[tuple(int(t) for t in prompt["input_ids"])] = (
                index,
                [int(t) for t in prompt["ar_output_ids"]],
            )

    @classmethod
    def from_env(cls, env_var: str = ENV_VAR) -> Oracle:
        path = os.environ.get(env_var, "")
        try:
            spec = json.loads(Path(path).read_text())
            return cls(spec["prompts"], spec["seed"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise OracleError(f"{env_var}={path}: cannot load the oracle ({exc})") from exc

    def placement(self, prompt_index: int, output_len: int, depth: int, topk: int) -> int:
        """Rank of the AR token at this draft position, or PLACE_ABSENT."""
        rng = random.Random(f"{self.seed}:{prompt_index}:{output_len}:{depth}")
        u = rng.random()
        if u < P_RANK0 or (topk == 1 and u < P_RANK0 + P_SIBLING):
            return 0
        if u < P_RANK0 + P_SIBLING:
            return rng.randrange(1, topk)
        return PLACE_ABSENT

    def continuation(self, req) -> tuple[int, list[int]] | None:
        """(prompt index, AR tokens after the root) for a request still on its AR path."""
        hit = self._by_prompt.get(tuple(req.origin_input_ids))
        if hit is None:
            return None
        index, ar = hit
        out = list(req.output_ids)
        if not out or out != ar[: len(out)]:
            return None
        return index, ar[len(out) :]

    def rewrite(self, reqs, top_tokens: torch.Tensor, top_logprobs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """New (top_tokens, top_logprobs) [B, D, K]; requests the oracle does not know keep theirs."""
        batch, depth, topk = top_tokens.shape
        tokens = top_tokens.cpu().clone()
        logprobs = top_logprobs.cpu().clone()
        ladder = torch.tensor([LADDER_TOP - LADDER_STEP * r for r in range(topk)], dtype=logprobs.dtype)
        for b, req in enumerate(reqs):
            hit = self.continuation(req)
            if hit is None:
                continue
            index, ahead = hit
            for d in range(min(depth, len(ahead))):
                rank = self.placement(index, len(req.output_ids), d + 1, topk)
                tokens[b, d] = place_token(tokens[b, d], ahead[d], rank)
                logprobs[b, d] = ladder
        return tokens.to(top_tokens.device), logprobs.to(top_logprobs.device)


def place_token(candidates: torch.Tensor, token: int, rank: int) -> torch.Tensor:
    """candidates [K] with `token` at `rank` (or nowhere for PLACE_ABSENT); the other
    ranks keep the drafter's order, without duplicates of `token`."""
    topk = candidates.shape[0]
    others = [int(t) for t in candidates.tolist() if int(t) != token]
    filler = 0
    while len(others) < topk:
        # The drafter offered `token` itself; pad with ids not yet used.
        while filler == token or filler in others:
            filler += 1
        others.append(filler)
    if rank == PLACE_ABSENT:
        row = others[:topk]
    else:
        row = others[:rank] + [token] + others[rank : topk - 1]
    return torch.tensor(row, dtype=candidates.dtype)


def topk_hook():
    """The oracle named by ENV_VAR, as the worker's top-K hook (the factory HOOK names)."""
    return Oracle.from_env(ENV_VAR).rewrite

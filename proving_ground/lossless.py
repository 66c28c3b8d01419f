"""The per-cell verdicts of the proving ground: lossless against the AR reference, and acceptance.

Greedy criterion: a cell's output must equal the AR reference token for token,
except that it may part from it at a tie, where either
- the reference's own top-2 log-probs are within `eps`, or
- in the exact model (the proving ground's target computed in fp32, proving_ground.exact) both
  tokens' logits lie within `exact_eps` of its top-1 logit.
Either is a numerical tie that any kernel-path change may break either way. The second is there
because the reference is a bf16 path too, and bf16 arithmetic can move this target's logits by
nats (bench/results/2026-12-03-pcie-ep8-emulated-tree-vs-chain).
After a tie the two continuations no longer share a prefix, so the comparison of that request
stops there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

# How far below the exact model's top-1 logit tokens a and b lie, after prompt `prompt` and these
# output tokens: (top - logit(a), top - logit(b)).
ExactModel = Callable[[int, list[int], int, int], tuple[float, float]]


@dataclass(frozen=True)
class TieRule:
    """When a greedy output may part from the AR reference (see the module's doc); `exact` is
    asked only where exact_eps > 0."""
    eps: float
    exact: ExactModel | None = None
    exact_eps: float = 0.0


@dataclass(frozen=True)
class Divergence:
    prompt: int
    position: int
    reference_token: int
    got_token: int
    gap: float | None  # reference top-1 minus top-2 log-prob; None when the reference has no log-probs there
    tie: bool
    # how far the reference's and the produced token lie below the exact model's top-1, where it was asked
    exact_below_top: tuple[float, float] | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def first_divergence(reference: list[int], got: list[int]) -> int | None:
    """Index of the first differing token; a length difference counts at the shorter end."""
    for i, (a, b) in enumerate(zip(reference, got)):
        if a != b:
            return i
    return None if len(reference) == len(got) else min(len(reference), len(got))


def top2_gap(top_logprobs: list) -> float | None:
    """Gap from one position of sglang's output_top_logprobs: [[logprob, token_id, text], ...]."""
    if not top_logprobs or len(top_logprobs) < 2:
        return None
    return float(top_logprobs[0][0]) - float(top_logprobs[1][0])


def judge(prompt: int, pos: int, reference: list[int], got_tok: int, gap: float | None, rule: TieRule) -> Divergence:
    """The Divergence at `pos`, where the output gave got_tok (-1: it had ended) and the reference
    reference[pos] (-1 past its end). The exact model is asked only where the reference's gap does
    not already make a tie, and only where both sides have a token."""
    ref_tok = reference[pos] if pos < len(reference) else -1
    if gap is not None and gap <= rule.eps:
        return Divergence(prompt, pos, ref_tok, got_tok, gap, True)
    if rule.exact is None or rule.exact_eps <= 0 or ref_tok < 0 or got_tok < 0:
        return Divergence(prompt, pos, ref_tok, got_tok, gap, False)
    below = tuple(float(x) for x in rule.exact(prompt, reference[:pos], ref_tok, got_tok))
    return Divergence(prompt, pos, ref_tok, got_tok, gap, max(below) <= rule.exact_eps, below)


def check_request(prompt: int, reference: list[int], reference_top2: list, got: list[int], rule: TieRule):
    """None when equal; else the Divergence (tie or not)."""
    pos = first_divergence(reference, got)
    if pos is None:
        return None
    gap = top2_gap(reference_top2[pos]) if pos < len(reference_top2) else None
    return judge(prompt, pos, reference, got[pos] if pos < len(got) else -1, gap, rule)


def divergences(outputs, reference: dict, rule: TieRule) -> list[Divergence]:
    """Each (prompt index, output ids[, tokens asked for]) of `outputs` against reference[index]
    ({output_ids, top2}), cut to the tokens asked for when a request asked for fewer."""
    found = []
    for index, got, *asked in outputs:
        expected = reference[index]["output_ids"][: asked[0]] if asked else reference[index]["output_ids"]
        found.append(check_request(index, expected, reference[index]["top2"], got, rule))
    return [d for d in found if d is not None]


def verdict(divergences: list[Divergence]) -> str:
    """'exact', 'lossless (ties only)' or 'FAIL'."""
    if not divergences:
        return "exact"
    return "lossless (ties only)" if all(d.tie for d in divergences) else "FAIL"


def acceptance(metas: list[dict]) -> float | None:
    """Committed tokens per verify step over a cell: sum(completion_tokens) / sum(spec_verify_ct)."""
    verify = sum(int(m.get("spec_verify_ct") or 0) for m in metas)
    if verify == 0:
        return None
    return sum(int(m.get("completion_tokens") or 0) for m in metas) / verify


def gap_stats(reference_top2: list[list]) -> dict:
    """Median / p10 / min / count-within-eps of the reference's top-2 gaps (how decisive the target is)."""
    gaps = sorted(g for row in reference_top2 for g in (top2_gap(pos) for pos in row) if g is not None)
    if not gaps:
        return {}
    return {"median": gaps[len(gaps) // 2], "p10": gaps[len(gaps) // 10], "min": gaps[0], "count": len(gaps)}


def stops(divergences: list[Divergence]) -> dict:
    """How many requests' comparisons stopped early at a tie, and at which output positions."""
    ties = [d for d in divergences if d.tie]
    return {"requests": len(ties), "positions": sorted(d.position for d in ties)[:20]}

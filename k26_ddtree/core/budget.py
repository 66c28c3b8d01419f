"""The DDTree budget's upper bound, in a torch-free module: the core, the SGLang wiring, the
profile validation and the proving-ground matrix all check budgets against this one rule."""


def max_budget(depth: int, topk: int) -> int:
    """Number of distinct prefixes of length 1..depth over topk ranks: sum of topk^d.

    With a DFlash block of size B the depth is B - 1 (position 0 is the root)."""
    return sum(topk**d for d in range(1, depth + 1))


def codes_fit(depth: int, topk: int, budget: int) -> bool:
    """Whether the tree builder's path codes fit their 31 bits: a code is written in base
    max(topk, 2) with one digit per level of the tree, min(depth, budget) levels, plus a
    leading 1, so it needs 2 * max(topk, 2)^min(depth, budget) <= 2^31."""
    return 2 * max(topk, 2) ** min(depth, budget) <= 1 << 31

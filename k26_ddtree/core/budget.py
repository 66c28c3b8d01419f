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


def tree_problem(depth: int, topk: int, budget: int) -> tuple[str, str] | None:
    """Why the tree builder cannot serve `budget` nodes at `topk` over `depth` draft positions,
    as (the setting to change, "budget" or "topk"; the reason, to follow its name and value); or None."""
    limit = max_budget(depth, topk)
    if budget > limit:
        return "budget", (f"{budget} is larger than the {limit} distinct draft prefixes of topk {topk} over "
                          f"{depth} draft positions (block size {depth + 1}); lower the budget or raise the topk")
    if not codes_fit(depth, topk, budget):
        return "topk", (f"{topk} is too wide for a tree of {min(depth, budget)} levels (the tree builder needs "
                        "max(topk, 2)^min(block size - 1, budget) <= 2^30); lower the topk or the budget")
    return None
